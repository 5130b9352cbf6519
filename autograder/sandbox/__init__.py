"""The student's process: the grader's side, the wire protocol, and the standalone student side (child)."""
