"""The student's side of the sandbox: a standalone package the sandbox's process loads by path, never the grader.

It enters the sandbox before it reads any student code, then answers the grader's requests: run the notebook's
cells, call an item on tensors the grader sent, construct a module, return its state, train a harness experiment.
Nothing here decides a score: the grader compares what comes back with its own reference.

Every message is one JSON line, followed by `blob` bytes of safetensors when it carries tensors, on pipes the grader
created: the grader never opens a path the student can name, so nothing the student leaves on disk (a FIFO, a
symlink, a huge file) can make the grader wait or write where it should not. The messages, the tags values travel
under and their limits are protocol.py's, the one definition both sides load.

A module per job: __main__.py starts it (the zygote's command line) and loads this folder as the package
`course_child`, never as part of `autograder`; helpers.py loads the grader's three standalone files it shares
(state.py, landlock.py, protocol.py) by path; isolation.py enters the sandbox; monitor.py is the zygote and the
monitor of each sandbox; server.py answers the requests; tripwire.py watches the oracles while it does. Nothing
here imports the grader's package (tests/unit/test_layers.py checks).
"""
