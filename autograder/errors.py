"""The errors and fault kinds every layer may raise or test for: a leaf module that imports nothing of the grader.

Whose fault is it decides what a person sees: ConfigError is the course's (course.yaml, a folder, a flag: exit 2),
GraderError is the grader's own (nothing is scored, the cause is named, exit 3, a rerun grades it), and an answer
of one of the UNUSABLE kinds is the student's (it loses the check that asked for it).
"""


class ConfigError(ValueError):
    """course.yaml is wrong: the message names the file and the key."""


class GraderError(Exception):
    """The grader itself could not grade (not the submission's doing): report it, score nothing, rerun."""


# What came back has the wrong structure for the check (a tensor where a pair was due): the answer's fault.
UNUSABLE = (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RuntimeError)
