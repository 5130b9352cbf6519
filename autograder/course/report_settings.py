"""course.yaml's settings of what a TA reads from a results folder (`course report`, `course stats`): no part of a
grading's identity (config.Course excludes them from its dump, batch/identity.py)."""
from pydantic import BaseModel, ConfigDict, Field, field_validator


class ReportSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # config.Strict's rule: config.py imports this module, not the reverse


class Similarity(ReportSettings):
    """`course report`'s similar submissions (autograder/reports/similarity.py)."""
    enabled: bool = True
    min_nodes: int = Field(40, ge=1)  # an item's code shorter than this (syntax nodes) is not compared
    min_items: int = Field(2, ge=1)   # a group is shown when it shares at least this many items


GRADER_REASONS = {  # a failure message that matches one names the grader or its machine, not the student's code
    "time limit": r"\(time limit\)",
    "memory limit": r"\(memory limit\)",
    "the process was killed": r"killed by signal|the notebook's process ended",
    "the device (CUDA)": r"\bCUDA\b|\bcuDNN\b|\bcuBLAS\b",
}


class Statistics(ReportSettings):
    """When `course stats` and the class report flag a check or an experiment (autograder/reports/check_stats.py,
    experiment_stats.py)."""
    min_attempted: int = Field(10, ge=1)            # no check is flagged on fewer judged submissions than this
    upper_fraction: float = Field(0.27, gt=0, lt=1)  # the upper group: this share of the best on the rest of the score
    upper_failure: float = Field(0.2, gt=0, le=1)   # fails good submissions: this share of the upper group fails it,
    low_discrimination: float = Field(-0.1, ge=-1, le=1)  # ... or its discrimination is at most this
    grader_share: float = Field(0.5, gt=0, le=1)    # this share of a check's failures give one of grader_reasons
    min_failures: int = Field(3, ge=1)               # ... out of at least this many failures
    crowd_band: float = Field(0.25, gt=0, le=1)     # a figure this part of the way from the bound to the lecture's
    crowd_share: float = Field(0.3, gt=0, le=1)     # figure crowds the bound; flagged when this share of them does
    reasons: int = Field(3, ge=1)                    # the most frequent failing reasons shown per check
    grader_reasons: dict[str, str] = Field(GRADER_REASONS)  # label -> a regular expression searched in a failure

    @field_validator("grader_reasons")
    @classmethod
    def compiles(cls, patterns: dict[str, str]) -> dict[str, str]:
        import re
        for label, pattern in patterns.items():
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"{label}: not a regular expression ({e}): {pattern}") from None
        return patterns
