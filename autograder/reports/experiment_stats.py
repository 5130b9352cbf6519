"""Each experiment of an assignment against its threshold, from a results folder (nothing is trained): per metric,
the students' figures, the bound, the lecture's figure, the reference's figure on each seed, how many figures crowd
the bound; and the one plot that shows them all (the class report's figure of the experiment).

The reference's figures come from the experiment cache, where `course experiments` and `course check --seeds` leave
them (remember_reference), keyed by what changes them (the code its run executes, the solution, the experiment's
course.yaml section, the seed, the device, the libraries, the data): a figure of another code or course.yaml is
never shown as this one's. None in the cache: the plot says so.

A figure crowds a bound when it lies within `crowd_band` of the way from the bound to the lecture's figure (of the
bound itself where the lecture gives none), on either side; an experiment is flagged when at least `crowd_share`
of a metric's measured figures crowd its bound (course.yaml's `statistics`): there, the seed and the machine decide
grades. A metric with two values at most (an indicator such as dae_beats_ae) does not crowd.
"""
from dataclasses import asdict, dataclass, field

from autograder.reports.check_stats import CROWDED, UNATTEMPTED, Flag, item_status
from autograder.reports.results_folder import figure_png
from autograder.reports.tables import experiment_figures


@dataclass
class MetricStat:
    """One metric of an experiment over the class."""
    metric: str
    values: list[float]         # the students' figures, measured
    bound: str                  # '>= 0.9', or '' for a metric without a threshold
    edges: list[tuple[str, float]]  # ('min', 0.9): each side of the bound
    lecture: float | None
    reference: dict[int, float]  # seed -> the reference's figure, from the cache
    bands: list[tuple[float, float]] = field(default_factory=list)  # around each side of the bound
    under: int = 0              # crowding figures that miss the bound
    over: int = 0               # ... and that hold it

    @property
    def crowded(self):
        return self.under + self.over

    @property
    def spread(self):
        """(min, median, max) of the students' figures, or None."""
        values = sorted(self.values)
        return (values[0], values[len(values) // 2], values[-1]) if values else None


@dataclass
class ExperimentStat:
    name: str
    item: str
    description: str
    attempted: int              # results whose item was attempted
    measured: int               # ... that trained and were measured
    passed: int
    metrics: list[MetricStat]
    flag: Flag | None = None
    figure: str | None = None   # the plot as base64 PNG, made on demand (with_figure)

    def as_json(self):
        out = asdict(self)
        out.pop("figure")
        for m, stat in zip(out["metrics"], self.metrics, strict=True):
            m["reference"] = {str(seed): v for seed, v in stat.reference.items()}
            m["crowded"] = stat.crowded
        return out


def experiment_stats(aid, rows, settings):
    """[ExperimentStat] of the experiments found in an assignment's (name, result) rows (an --items run's among
    them: no total is compared here), each flagged when its figures crowd a bound; none when course.yaml does not
    know the assignment."""
    from autograder.course.config import load_course
    from autograder.grading.cache import cache_off
    course = load_course()
    if aid not in course.assignments:
        return []
    experiments = course.assignment(aid).experiments
    found, attempted, devices = {}, {}, {}
    for _, result in rows:
        device = result.get("extra_data", {}).get("device")
        devices[device] = devices.get(device, 0) + 1
        by_item = {}
        for test in result["tests"]:
            by_item.setdefault(test["item"], []).append(test)
        for f in experiment_figures(result):
            found.setdefault(f["name"], []).append(f)
            attempted[f["name"]] = attempted.get(f["name"], 0) + (item_status(f["item"], by_item[f["item"]])
                                                                  != UNATTEMPTED)
    by_use = sorted(devices, key=lambda d: -devices[d])
    inputs = reference_inputs(aid) if found and not cache_off() else None  # no cache: no reference to look up
    out = []
    for name, figures in found.items():
        exp = experiments[name]
        reference = reference_figures(exp, by_use, inputs) if inputs else {}
        metrics = [metric_stat(m, exp, figures, reference, settings.crowd_band)
                   for m in dict.fromkeys([*exp.threshold, exp.metric])]
        stat = ExperimentStat(name, figures[0]["item"], exp.description, attempted[name],
                              sum(bool(f["metrics"]) for f in figures), sum(f["passed"] for f in figures),
                              [m for m in metrics if m.values or m.bound])
        stat.flag = crowding_flag(aid, stat, settings)
        out.append(stat)
    return out


def metric_stat(metric, exp, figures, reference, band):
    """MetricStat of one metric: the figures measured, and those crowding each side of its bound."""
    values = [f["metrics"][metric] for f in figures if metric in f["metrics"]]
    bound = exp.threshold.get(metric)
    edges = [(side, getattr(bound, side)) for side in ("min", "max") if bound and getattr(bound, side) is not None]
    stat = MetricStat(metric, values, str(bound) if bound else "", edges, exp.lecture.get(metric),
                      {seed: m[metric] for seed, m in reference.items() if metric in m})
    if bound is None or len(set(values)) <= 2:
        return stat
    for _, edge in edges:
        lecture = exp.lecture.get(metric)
        scale = abs(lecture - edge) if lecture is not None and lecture != edge else abs(edge)
        if scale > 0:
            stat.bands.append((edge - band * scale, edge + band * scale))
    for v in values:
        if any(lo <= v <= hi for lo, hi in stat.bands):
            if bound.holds(v):
                stat.over += 1
            else:
                stat.under += 1
    return stat


def crowding_flag(aid, stat, settings):
    """The experiment's flag when a metric's figures crowd its bound (module doc), the most crowded one; or None."""
    crowded = [m for m in stat.metrics if m.values and len(m.values) >= settings.min_attempted
               and m.crowded >= settings.crowd_share * len(m.values)]
    if not crowded:
        return None
    m = max(crowded, key=lambda m: m.crowded / len(m.values))
    lo, hi = m.bands[0]
    return Flag(CROWDED, f"experiment {stat.name}",
                f"{m.crowded} of the {len(m.values)} measured figures of {m.metric} lie within {(hi - lo) / 2:.3g} "
                f"of its bound ({m.bound}): {m.under} just missing it, {m.over} just holding it "
                f"(flagged from {settings.crowd_share:.0%})",
                f"Where the class lands this close to the bound, the seed and the machine decide grades: compare "
                f"the reference's seeds (`course check {aid} --seeds 4`) and the lecture's figure before keeping it")


# --- the reference's figures, kept in the experiment cache ------------------------------------------------------

def reference_inputs(aid):
    """What every experiment of the assignment shares in its reference figures' key: the code its runs execute, the
    solution, the libraries, the data (hashing the code once, not once per experiment, seed and device)."""
    from autograder.grading.cache import libraries
    from autograder.grading.experiments import data_source_of, experiment_code, solution_fingerprint
    return {"code": experiment_code(aid), "solutions": solution_fingerprint(aid), "libraries": libraries(),
            "data": data_source_of(aid)}


def reference_key(exp, seed, device, inputs):
    """The cache key of the reference's figures: what changes them (module doc); `inputs`: reference_inputs."""
    from autograder.grading.cache import experiment_key
    return experiment_key({"reference figures": exp.name, "cfg": exp.run_cfg, "seed": seed, "device": device,
                           **inputs})


def remember_reference(aid, run, device):
    """Keep a reference run's figures (experiments.run_reference's ExperimentResult) for the report's plot."""
    from autograder.course.config import load_course
    from autograder.grading.cache import cache_write
    from autograder.grading.experiments import resolve_device
    exp = load_course().assignment(aid).experiments[run.name]
    figures = {k: float(v) for k, v in run.metrics.items() if isinstance(v, (int, float))}
    cache_write(reference_key(exp, run.seed, resolve_device(device), reference_inputs(aid)), figures)


def reference_figures(exp, devices, inputs):
    """seed -> the reference's figures on it, for each of the experiment's seeds the cache holds, on the first of
    `devices` (the results' devices, most used first) that has any; `inputs`: reference_inputs."""
    from autograder.grading.cache import cache_read
    for device in (d for d in devices if d in ("cpu", "cuda")):
        found = {seed: figures for seed in exp.seeds
                 if isinstance(figures := cache_read(reference_key(exp, seed, device, inputs)), dict)}
        if found:
            return found
    return {}


# --- the plot ---------------------------------------------------------------------------------------------------

def with_figure(stat):
    """The ExperimentStat with its plot made: a row per metric, the students' figures as a histogram beside the
    bound (its failing side shaded), the crowding band, the lecture's figure and the reference's seeds; and, where
    the class spreads far from the bound, the same near the bound, where crowding shows."""
    import matplotlib.pyplot as plt
    shown = [m for m in stat.metrics if m.values]
    if not shown:
        return stat
    nears = [near_window(m) for m in shown]
    columns = 2 if any(nears) else 1
    fig, axes = plt.subplots(len(shown), columns, figsize=(5.2 * columns + 0.6, 3.0 * len(shown)), squeeze=False)
    for row, m, near in zip(axes, shown, nears, strict=True):
        panel(row[0], m, None)
        row[0].legend(loc="best", fontsize=7)  # one legend a row: the zoom beside it has the same marks
        if columns == 2 and near:
            panel(row[1], m, near)
            row[1].set_title(f"near the bound: {sum(near[0] <= v <= near[1] for v in m.values)} of "
                             f"{len(m.values)} figures", fontsize=9)
        elif columns == 2:
            row[1].axis("off")
    fig.suptitle(f"experiment {stat.name}: {stat.passed} of {stat.measured} measured passed")
    fig.tight_layout()
    stat.figure = figure_png(fig)
    return stat


def near_window(m):
    """(lo, hi) around the bound, the lecture's figure and the crowding band, when it leaves figures out (a zoom
    is worth a panel); else None."""
    if not m.edges:
        return None
    marks = [e for _, e in m.edges] + [x for band in m.bands for x in band]
    marks += [m.lecture] if m.lecture is not None else []
    lo, hi = min(marks), max(marks)
    pad = (hi - lo) * 0.5 or abs(hi) * 0.05 or 0.05
    window = (lo - pad, hi + pad)
    inside = sum(window[0] <= v <= window[1] for v in m.values)
    return window if 0 < inside < len(m.values) else None


def panel(ax, m, window):
    """One metric's histogram with its marks, over `window` (lo, hi) or all the figures."""
    values = [v for v in m.values if window is None or window[0] <= v <= window[1]]
    marks = [*m.values, *m.reference.values(), *(e for _, e in m.edges), *(x for b in m.bands for x in b),
             *([m.lecture] if m.lecture is not None else [])]
    lo, hi = window or (min(marks), max(marks))
    pad = 0 if window else (hi - lo) * 0.06 or abs(hi) * 0.05 or 0.05
    lo, hi = lo - pad, hi + pad
    ax.hist(values, bins=30, range=(lo, hi), color="C0", alpha=0.85, label=f"students ({len(values)})")
    for blo, bhi in m.bands:
        ax.axvspan(blo, bhi, color="orange", alpha=0.3, zorder=0, label=f"crowding ({m.crowded})")
    for side, edge in m.edges:
        ax.axvspan(*((lo, edge) if side == "min" else (edge, hi)), color="C3", alpha=0.06, zorder=0)
        ax.axvline(edge, color="C3", ls="--", label=f"threshold {m.bound}")
    if m.lecture is not None:
        ax.axvline(m.lecture, color="k", ls=":", label=f"lecture {m.lecture:g}")
    for k, (seed, value) in enumerate(sorted(m.reference.items())):
        ax.axvline(value, color="C2", lw=1.5, ls=("-", "-.", "--", ":")[k % 4],
                   label=f"reference, seed {seed}: {value:.4g}")
    if not m.reference:
        ax.plot([], [], color="C2", label="reference: none cached (course experiments)")
    ax.set_xlim(lo, hi)
    ax.set_xlabel(m.metric)
    ax.set_ylabel("submissions")
