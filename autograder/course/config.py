"""course.yaml: load, validate, and answer questions about points, limits and experiments."""
import os
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from autograder.course.exchange import Exchange
from autograder.course.oracles import oracle_problem
from autograder.course.profiles import Profile, apply, chosen
from autograder.course.report_settings import Similarity, Statistics
from autograder.course.root import ROOT, course_root
from autograder.course.solutions_import import install
from autograder.errors import ConfigError

CHECK_ORDER = ("exists", "shapes", "values", "gradients", "properties")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(Strict):
    """The sandbox's limits: course.yaml's `limits`, with an item's or the Gradescope profile's overrides applied."""
    setup_seconds: float = Field(120, gt=0)
    item_seconds: float = Field(60, gt=0)
    experiment_seconds: float = Field(900, gt=0)
    memory_mb: int = Field(6144, gt=0)
    output_kb: int = Field(64, gt=0)
    disk_mb: int = Field(256, gt=0)
    processes: int = Field(256, gt=0)
    search_seconds: float = Field(5, ge=0)  # per failing item: the smallest failing case's search (0: none)
    allow_unisolated: bool = False  # grade where the sandbox gets no isolation at all (a trusted class only)


COURSE_WIDE = {"allow_unisolated"}  # limits an item or the Gradescope profile cannot override

# An item's `limits:` and `gradescope.limits`: any of Limits' fields but COURSE_WIDE, with the same types and bounds;
# None (left out) keeps the course's value.
if TYPE_CHECKING:  # the type checker sees Limits' fields, all optional (None: the course's value)
    class LimitOverrides(Strict):
        setup_seconds: float | None = None
        item_seconds: float | None = None
        experiment_seconds: float | None = None
        memory_mb: int | None = None
        output_kb: int | None = None
        disk_mb: int | None = None
        processes: int | None = None
        search_seconds: float | None = None
else:
    LimitOverrides = create_model("LimitOverrides", __base__=Strict, **{
        name: (Annotated[(f.annotation, *f.metadata)] | None, None)
        for name, f in Limits.model_fields.items() if name not in COURSE_WIDE})


class Bound(Strict):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def one_side(self) -> "Bound":
        if self.min is None and self.max is None:
            raise ValueError("a threshold needs `min` or `max`")
        return self

    def holds(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        return " and ".join(s for s in (self.min is not None and f">= {self.min:g}",
                                        self.max is not None and f"<= {self.max:g}") if s)


Dependencies = Literal["independent", "cascade"]  # a mistake costs points once, or in every item built on it


class Budgets(Strict):
    """How experiments spend their steps (course.yaml's `experiments:`; harness/training.py hopeless_reason)."""
    # a validation is judged hopeless only from this multiple of the step at which the reference cleared its marks
    hopeless_after: float = Field(1.0, ge=1)
    # ... when every stopping figure is below this fraction of the reference's figure at that step
    hopeless_fraction: float = Field(0.5, gt=0, le=1)
    # the next seed is tried only when each figure the last one missed was within this fraction of its bound
    close: float = Field(0.2, ge=0)
    # a run validates from this fraction of the step at which the reference cleared its marks (0: from the start)
    validate_from: float = Field(0.5, ge=0, le=1)
    # `course check --seeds`: the reference must clear every bound by this much on each seed (no grading reads it)
    min_margin: float = Field(0.005, ge=0, exclude=True)

    def hopeless_rule(self, after: float | None = None, validate_from: float | None = None) -> dict[str, float]:
        """The rule as the harness's training reads it (cfg["hopeless"]); `after`, `validate_from`: an experiment's
        own."""
        return {"after": after or self.hopeless_after, "fraction": self.hopeless_fraction,
                "validate_from": self.validate_from if validate_from is None else validate_from}


class Item(Strict):
    signature: str
    methods: dict[str, str] = {}
    from_scratch: list[str] = []
    # items its checks hand the student's code of beyond those its reference code calls (grading/dependencies.py)
    checked_with: list[str] = []
    points: dict[Literal["exists", "shapes", "values", "gradients", "properties"], float]
    limits: LimitOverrides = LimitOverrides()
    # its shapes check runs again with every input on torch's meta device (grading/device_check.py); false, with the
    # reason in a comment, for an item whose reference cannot run there
    device_check: bool = True

    @field_validator("points")
    @classmethod
    def positive(cls, points: dict[str, float]) -> dict[str, float]:
        if not points or any(p <= 0 for p in points.values()):
            raise ValueError("every check needs positive points, and an item needs at least one check")
        return points


class Experiment(Strict):
    item: str | None = None
    points: float = Field(ge=0)
    description: str
    metric: str
    threshold: dict[str, Bound]
    lecture: dict[str, float] = {}
    steps: int = Field(gt=0)
    seeds: list[int] = Field(min_length=1)
    dependencies: Dependencies | None = None  # None: the assignment's
    hopeless_after: float | None = Field(None, ge=1)  # None: the course's `experiments.hopeless_after`
    validate_from: float | None = Field(None, ge=0, le=1)  # None: the course's `experiments.validate_from`
    min_margin: dict[str, float] = Field({}, exclude=True)  # metric -> its own `course check --seeds` margin
    name: str = ""
    _hopeless: dict[str, float] = PrivateAttr(default_factory=lambda: Budgets().hopeless_rule())  # the course's

    @property
    def graded(self) -> bool:
        return self.points > 0

    @property
    def cfg(self) -> dict[str, Any]:
        """The plain dict the harness functions receive."""
        return {"name": self.name, "steps": self.steps, "seeds": list(self.seeds), "metric": self.metric,
                "threshold": {k: b.model_dump() for k, b in self.threshold.items()}, "lecture": dict(self.lecture),
                "hopeless": dict(self._hopeless)}

    @property
    def run_cfg(self) -> dict[str, Any]:
        """cfg as far as it can change a run, for the keys of cached runs: a threshold's `min` also stops training
        (harness/training.py pass_marks), a `max` only judges the figures, which a cached run has judged again."""
        cfg = self.cfg
        cfg["threshold"] = {k: {"min": b["min"]} for k, b in cfg["threshold"].items() if b["min"] is not None}
        return cfg

    def failures(self, metrics: dict[str, float]) -> list[str]:
        """The thresholds these metrics miss, each as a readable sentence."""
        out = []
        for key, bound in self.threshold.items():
            if key not in metrics:
                out.append(f"metric '{key}' was not measured")
            elif not bound.holds(metrics[key]):
                out.append(f"{key} = {metrics[key]:.4g}, needs {bound}")
        return out

    def came_close(self, metrics: dict[str, float] | None, within: float) -> bool:
        """Whether every thresholded figure was measured and lies within `within` times its bound of it (course.yaml's
        `experiments.close`): only such a miss is worth another seed."""
        def near(value: float, bound: Bound) -> bool:
            return ((bound.min is None or value >= bound.min - within * abs(bound.min))
                    and (bound.max is None or value <= bound.max + within * abs(bound.max)))
        return metrics is not None and all(
            isinstance(metrics.get(k), (int, float)) and near(metrics[k], b) for k, b in self.threshold.items())


class LatePolicy(Strict):
    """course.yaml `late:` (an assignment's own replaces the keys it names), applied when a grade is read."""
    grace_minutes: float = Field(0, ge=0)                 # on time up to this long after the due time
    percent_per_day: float = Field(0, ge=0, le=100)       # off the raw score per started day after the due time
    floor_percent: float = Field(0, ge=0, le=100)         # a late submission keeps at least this share of its raw score
    close_days: float | None = Field(None, gt=0)          # later than this after the due time: 0 (graded, raw kept)


if TYPE_CHECKING:
    class LateOverrides(Strict):
        grace_minutes: float | None = None
        percent_per_day: float | None = None
        floor_percent: float | None = None
        close_days: float | None = None
else:
    LateOverrides = create_model("LateOverrides", __base__=Strict, **{
        name: (Annotated[(f.annotation, *f.metadata)] | None, None) for name, f in LatePolicy.model_fields.items()})


def aware(value: Any) -> Any:
    """A due time as ISO 8601 with its UTC offset ('2026-12-12T23:59:00+05:30'); a time without one is refused,
    since the grader's clock and the students' would read it differently."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an ISO 8601 time such as 2026-12-12T23:59:00+05:30") from None
    if isinstance(value, datetime) and value.tzinfo is None:
        raise ValueError(f"{value.isoformat()} has no UTC offset: write it as {value.isoformat()}+00:00 (or your "
                         f"zone's offset)")
    return value


class Written(Strict):
    """A written answer (a markdown cell `answer_*` graded by hand): its points and the rubric TAs see in formgrader."""
    points: float = Field(ge=0)
    rubric: str = ""


class DemoMistake(Strict):  # `course demo`'s typical mistake: `reference` in the item's solved cell becomes `wrong`
    item: str
    reference: str
    wrong: str


class Assignment(Strict):
    title: str
    lecture: str
    notebook: str
    items: dict[str, Item]
    experiments: dict[str, Experiment] = {}
    # grade_id -> its written answer; TAs grade them in formgrader. Excluded from model_dump: no automatic score
    # depends on them, so they are no part of a grading's identity (batch/identity.py), and a rubric's edit regrades
    # nothing
    written: dict[str, Written] = Field({}, exclude=True)
    # What `mask` means in this notebook's items, said in its rules cell beside the other notebooks'
    # (notebooks/rules.py): text for students, so no part of a grading's identity
    mask_convention: str = Field("", exclude=True)
    # NAME: key, the constants of the facts cell `course sync` writes (notebooks/facts.py): text for students
    facts: dict[str, str] = Field({}, exclude=True)
    # the demo's partly right submission makes it (none: half the items done, nothing wrong); grades nothing
    demo_mistake: DemoMistake | None = Field(None, exclude=True)
    # The deadline and this assignment's late policy (over the course's `late:`): applied when a grade is read, so
    # no part of a grading's identity either; changing them regrades nothing
    due: datetime | None = Field(None, exclude=True)
    late: LateOverrides = Field(LateOverrides(), exclude=True)

    @field_validator("due", mode="before")
    @classmethod
    def due_has_an_offset(cls, value: Any) -> Any:
        return aware(value)
    dependencies: Dependencies | None = None  # None: the course's
    preload: list[str] = []  # modules each sandbox zygote imports once its first sandbox is out (course.yaml)
    # its own from-scratch oracles (`course new --from-scratch ITEM=ORACLE` writes them), name -> dotted paths as the
    # course's shared `oracles:`, which they extend; left out of a grading's identity while empty (none of the
    # course's lectures has any), so adding the field regrades nothing
    oracles: dict[str, list[str]] = Field({}, exclude_if=lambda oracles: not oracles)
    id: str = ""

    @model_validator(mode="after")
    def experiments_name_items(self) -> "Assignment":
        for item, spec in self.items.items():
            unknown = [n for n in spec.checked_with if n not in self.items or n == item]
            if unknown:
                raise ValueError(f"items.{item}.checked_with: {', '.join(map(repr, unknown))} is not another item "
                                 f"of this assignment")
        bad = [gid for gid in self.written if not gid.startswith("answer_")]
        if bad:
            raise ValueError(f"written: {', '.join(map(repr, bad))}: a written answer's grade_id starts with answer_")
        if self.demo_mistake and self.demo_mistake.item not in self.items:
            raise ValueError(f"demo_mistake.item: '{self.demo_mistake.item}' is not an item of this assignment")
        for name, exp in self.experiments.items():
            exp.name = name
            if exp.item is not None and exp.item not in self.items:
                raise ValueError(f"experiments.{name}.item: '{exp.item}' is not an item of this assignment")
            if exp.graded and exp.item is None:
                raise ValueError(f"experiments.{name}: an experiment with points needs an `item`")
        return self

    def item_points(self, item: str) -> float:
        """Total points of one item: its checks plus the experiments it trains."""
        return sum(self.items[item].points.values()) + sum(
            e.points for e in self.experiments.values() if e.item == item)

    @property
    def total_points(self) -> float:
        """The automatic points: every item's checks and experiments (written answers are apart: written_points)."""
        return sum(self.item_points(i) for i in self.items)

    @property
    def written_points(self) -> float:
        """The written answers' points, graded by TAs in formgrader, beside the automatic total."""
        return sum(q.points for q in self.written.values())

    def experiments_of(self, item: str) -> list[Experiment]:
        return [e for e in self.experiments.values() if e.item == item and e.graded]


class Gradescope(Strict):
    """`course export gradescope`: the limits its zip grades with, so that grading fits Gradescope's container."""
    timeout_minutes: float = Field(20, gt=0)     # the autograder timeout to set on Gradescope (README)
    budget_seconds: float = Field(900, gt=0)     # grading starts no item whose worst case would end past this
    container_memory_mb: int = Field(3072, gt=0)  # the container's memory to choose on Gradescope (README)
    limits: LimitOverrides = LimitOverrides()    # replace the course's `limits` in the zip's course.yaml

    @model_validator(mode="after")
    def fits_the_container(self) -> "Gradescope":
        # Otter's start, the kernel and results.json need the rest of the timeout; past it the student gets 0
        # with no feedback at all
        if self.budget_seconds > self.timeout_minutes * 60 - 60:
            raise ValueError(f"budget_seconds ({self.budget_seconds:g}) must leave at least a minute of "
                             f"timeout_minutes ({self.timeout_minutes:g} min) for Otter and results.json")
        # the sandbox's own memory limit must trigger before the container's OOM killer picks the grader
        if self.limits.memory_mb is not None and self.limits.memory_mb > self.container_memory_mb - 1024:
            raise ValueError(f"limits.memory_mb ({self.limits.memory_mb}) must stay 1024 MB below "
                             f"container_memory_mb ({self.container_memory_mb}): the grader and torch need it")
        return self


class Data(Strict):
    mnist_dir: str
    mnist_download: bool = False


class Course(Strict):
    course: str
    data: Data
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int = Field(1, ge=1)  # CPU threads per sandbox at most (sandbox/zygote.py threads_per_worker)
    seed: int
    dependencies: Dependencies = "independent"  # an assignment or an experiment may say otherwise
    limits: Limits = Limits()
    late: LatePolicy = Field(LatePolicy(), exclude=True)  # applied when a grade is read (course/lateness.py)
    exchange: Exchange = Field(Exchange(), exclude=True)  # nbgrader's exchange on a hub: no part of a grading
    experiments: Budgets = Budgets()
    gradescope: Gradescope = Gradescope()
    # excluded from model_dump: how the report reads results is no part of a grading's identity (batch.py)
    similarity: Similarity = Field(Similarity(), exclude=True)
    statistics: Statistics = Field(Statistics(), exclude=True)  # `course stats`' flags: likewise
    # what COURSE_PROFILE may choose (course/profiles.py); the one chosen is applied before validation, so it is in
    # the assignments' settings, and so in a grading's identity
    profiles: dict[str, Profile] = Field({}, exclude=True)
    assignments: dict[str, Assignment]
    # oracle name (an item's `from_scratch`) -> the dotted paths of the functions it stands for, watched in the sandbox
    oracles: dict[str, list[str]] = Field({}, validate_default=True)
    # the experiment cache's shared folder (grading/cache.py shared_folder): where runs are kept, not what they are
    cache_dir: str | None = Field(None, exclude=True)
    path: Path = ROOT / "course.yaml"

    @field_validator("oracles")
    @classmethod
    def oracles_cover_from_scratch(cls, oracles: dict[str, list[str]], info: Any) -> dict[str, list[str]]:
        problem = oracle_problem(oracles, info.data.get("assignments") or {})
        if problem:
            raise ValueError(problem)
        return oracles

    @model_validator(mode="after")
    def name_assignments(self) -> "Course":
        for aid, a in self.assignments.items():
            a.id = aid
            for exp in a.experiments.values():
                exp._hopeless = self.experiments.hopeless_rule(exp.hopeless_after, exp.validate_from)
        return self

    @property
    def mnist_dir(self) -> Path:
        d = Path(os.path.expanduser(self.data.mnist_dir))
        return d if d.is_absolute() else (self.path.parent / d).resolve()

    @property
    def mnist_download(self) -> bool:
        return self.data.mnist_download

    def assignment(self, aid: str) -> Assignment:
        if aid not in self.assignments:
            raise ConfigError(f"{self.path}: no assignment '{aid}' (known: {', '.join(self.assignments)})")
        return self.assignments[aid]

    def oracles_for(self, aid: str) -> dict[str, list[str]]:
        """The oracles an assignment's from-scratch names stand for: the course's shared table and its own."""
        return {**self.oracles, **self.assignment(aid).oracles}

    def dependencies_for(self, aid: str, experiment: str | None = None) -> str:
        """'independent' or 'cascade': the experiment's own choice, else its assignment's, else the course's."""
        a = self.assignment(aid)
        own = a.experiments[experiment].dependencies if experiment is not None else None
        return own or a.dependencies or self.dependencies

    def late_policy(self, aid: str) -> LatePolicy:
        """The course's late policy with the assignment's own keys over it."""
        return LatePolicy(**{**self.late.model_dump(),
                             **self.assignment(aid).late.model_dump(exclude_none=True)})

    def limits_for(self, aid: str, item: str | None = None) -> Limits:
        """The course-wide limits with the item's overrides applied."""
        merged = self.limits.model_dump()
        if item is not None:
            merged.update({k: v for k, v in self.assignment(aid).items[item].limits.model_dump().items()
                           if v is not None})
        return Limits(**merged)


def parse_course(text: str, path: str | Path, profile: str = "") -> "Course":
    """Validate course.yaml's text, with `profile` (course/profiles.py) applied; errors name the file and the
    dotted key."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    raw = apply(raw, profile, path)
    try:
        return Course(**raw, path=Path(path))
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            lines.append(f"{path}: {key}: {msg}")
        raise ConfigError("\n".join(lines)) from None


@lru_cache(maxsize=4)
def _load(path: str, version: tuple[int, int], profile: str) -> Course:
    return parse_course(Path(path).read_text(), path, profile)


def load_course(path: str | Path | None = None) -> Course:
    """The course configuration: $COURSE_CONFIG, else course.yaml at the course root (course_root()), with the
    profile $COURSE_PROFILE names; read again once the file or the profile changes (`course new` adds to it, and its
    next step reads it)."""
    resolved = Path(path or os.environ.get("COURSE_CONFIG") or course_root() / "course.yaml").resolve()
    stat = resolved.stat() if resolved.exists() else None  # a missing file: parse_course's reading names it
    return _load(str(resolved), (stat.st_mtime_ns, stat.st_size) if stat else (0, 0), chosen())


def released_notebook(aid: str) -> Path:
    """release/<aid>/<aid>.ipynb at the course root: its setup cells are the trusted ones, so grading needs it."""
    root = course_root()
    path = root / "release" / aid / f"{aid}.ipynb"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: the released notebook's setup cells are what a submission is graded "
                          f"with; build it with `course release {aid}` in {root} (or name the course with --course)")
    return path


install()  # `import solutions` is the course's (course/solutions_import.py): every reader of course.yaml has it
