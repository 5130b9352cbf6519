"""The errors and fault kinds every layer may raise or test for: a leaf module that imports nothing of the grader.

Whose fault is it decides what a person sees: ConfigError is the course's (course.yaml, a folder, a flag: exit 2),
GraderError is the grader's own (nothing is scored, the cause is named, exit 3, a rerun grades it; a SetupProblem
behind it is the machine's or the course's, named once per batch), and an answer of one of the UNUSABLE kinds is
the student's (it loses the check that asked for it).
"""


class ConfigError(ValueError):
    """course.yaml is wrong: the message names the file and the key."""


class GraderError(Exception):
    """The grader itself could not grade (not the submission's doing): report it, score nothing, rerun."""


class SetupProblem(Exception):
    """What the machine or the course lacks for grading (MNIST, isolation): its message is one line saying what
    failed, why, and the setting that fixes it. The same for every submission: a batch reports it once."""


def setup_problem(exc: BaseException | None) -> SetupProblem | None:
    """The SetupProblem behind a grader failure (`exc` or what it was raised from), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SetupProblem):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# What came back has the wrong structure for the check (a tensor where a pair was due): the answer's fault.
UNUSABLE = (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RuntimeError)
