"""Profiles: named changes to course.yaml's experiments, chosen with COURSE_PROFILE=NAME (`course --profile NAME`).

A profile runs the whole pipeline (release, sandbox, checks, experiments, results, exports) with another training
budget: `rehearsal` trains each experiment a few steps on its first seed with bounds any figure meets, for a TA's
dry run of a new machine, a hub or a cluster, and for the project's tests of mechanism, where the figure is not what
they check. The change is made to course.yaml's mapping before it is validated, so it is part of every grading's
identity (batch/identity.py): a result graded under a profile is never reused by a grading without it, or under
another. Figures graded under a profile mean nothing; `course` says so on every command that runs with one.

    profiles:
      rehearsal:
        experiments: {steps: 5, seeds: 1, bounds: any}
"""
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ENV = "COURSE_PROFILE"
ANY = 1e30  # a bound any finite figure meets, kept on its side (min or max) so that facts naming the side still hold


class ExperimentChange(BaseModel):
    """What a profile does to every experiment: its steps, how many of its seeds, and its bounds."""
    model_config = ConfigDict(extra="forbid")
    steps: int | None = Field(None, gt=0)  # None: each experiment's own
    seeds: int | None = Field(None, gt=0)  # the first N of each experiment's seeds; None: all
    bounds: Literal["kept", "any"] = "kept"  # any: every threshold met by any figure (a dry run passes)


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    experiments: ExperimentChange = ExperimentChange()


def chosen() -> str:
    """The profile COURSE_PROFILE names ('' for none)."""
    return os.environ.get(ENV, "").strip()


def apply(raw: dict[str, Any], name: str, path: Any) -> dict[str, Any]:
    """course.yaml's mapping with profile `name` applied to every assignment's experiments ('' : unchanged)."""
    from autograder.errors import ConfigError
    if not name:
        return raw
    profiles = raw.get("profiles") or {}
    if name not in profiles:
        raise ConfigError(f"{path}: {ENV}={name}: no such profile (course.yaml's profiles: "
                          f"{', '.join(profiles) or 'none'})")
    change = Profile(**profiles[name]).experiments
    for assignment in (raw.get("assignments") or {}).values():
        for exp in (assignment.get("experiments") or {}).values():
            if change.steps is not None:
                exp["steps"] = change.steps
            if change.seeds is not None:
                exp["seeds"] = list(exp.get("seeds", []))[:change.seeds]
            if change.bounds == "any":
                exp["threshold"] = {metric: {"min": -ANY} if "min" in bound else {"max": ANY}
                                    for metric, bound in (exp.get("threshold") or {}).items()}
    return raw


def notice(name: str) -> str:
    """The line `course` prints when a profile is in force."""
    return f"course: profile `{name}` ({ENV}): experiments as course.yaml's profiles.{name} sets them; their " \
           f"figures are not the course's"
