"""The anchors' paths: nbgrader's preprocessors, Otter-Grader's plugin, Gradescope's zip."""
