"""The lectures' training loops: one module per assignment, run by the grader with the student's parts."""
