"""An assignment's statistics as a whole (check_stats.py per check, experiment_stats.py per experiment, the flags
of both), and the ways they are read: `course stats` (a table in the terminal), `course report --json` (for
scripts) and the class report's section (templates/report/check_stats.html.j2)."""
import textwrap
from dataclasses import asdict, dataclass, field

from autograder.reports.check_stats import CheckStat, Flag, ItemStat, check_flags, check_stats, whole_results
from autograder.reports.experiment_stats import experiment_stats
from autograder.reports.results_folder import by_assignment, load_results
from autograder.reports.tables import WIDTH, score_text


@dataclass
class AssignmentStats:
    """An assignment's statistics: from its `submissions` whole results (the `partial` ones, graded on some items
    only, count in the experiments alone: their totals are not comparable), per item, check and experiment."""
    aid: str
    submissions: int
    partial: int
    items: list[ItemStat]
    checks: list[CheckStat]
    experiments: list = field(default_factory=list)   # experiment_stats.ExperimentStat
    flags: list[Flag] = field(default_factory=list)

    def as_json(self):
        """A plain dict: every number, the rates included, and each flag with its evidence."""
        out = asdict(self)
        for check, stat in zip(out["checks"], self.checks, strict=True):
            check.update(name=stat.name, pass_rate=stat.pass_rate, upper_failure=stat.upper_failure,
                         failed=stat.failed, reasons=[{"reason": r, "count": n} for r, n in stat.reasons])
        out["experiments"] = [e.as_json() for e in self.experiments]
        return out


def assignment_stats(aid, rows, settings=None):
    """AssignmentStats of one assignment's (name, result) rows (results_folder.load_results), flags included;
    `settings`: course.yaml's `statistics` unless given."""
    if settings is None:
        from autograder.course.config import load_course
        settings = load_course().statistics
    whole, partial = whole_results(rows)
    items, checks = check_stats(whole, settings)
    stats = AssignmentStats(aid, len(whole), partial, items, checks, experiment_stats(aid, rows, settings))
    stats.flags = check_flags(aid, checks, settings) + [e.flag for e in stats.experiments if e.flag]
    return stats


def folder_stats(folder, aid=None):
    """[AssignmentStats] of every assignment in a results folder (or of `aid` alone)."""
    from autograder.errors import ConfigError
    found = by_assignment(load_results(folder))
    if aid is not None:
        if aid not in found:
            known = ", ".join(found) or "none"
            raise ConfigError(f"{folder}: no results of {aid} there (assignments found: {known})")
        found = {aid: found[aid]}
    if not found:
        raise ConfigError(f"no results.json files in {folder} or the folders below it")
    return [assignment_stats(a, rows) for a, rows in found.items()]


def percent(rate):
    return "-" if rate is None else f"{rate:.0%}"


def signed(value):
    return "-" if value is None else f"{value:+.2f}"


def stats_lines(stats, width=WIDTH):
    """`course stats`: the per-check table, the flags with their evidence, each experiment's figures; no line is
    over `width`."""
    from autograder.course.config import load_course
    s = load_course().statistics
    lines = [f"{stats.aid}: {stats.submissions} submissions"
             + (f" ({stats.partial} more graded on some items only: in the experiments alone)" if stats.partial
                else "")]
    lines += textwrap.wrap("attempted: the item is no stub. judged: its check ran on the submission's own code "
                           "(the whole item not zeroed, the check not skipped). pass: of the judged. discr.: the "
                           "point-biserial correlation of passing with the rest of the score. upper fail: of the "
                           f"best {s.upper_fraction:.0%} on the rest of the score, how many fail the check. Under a "
                           "check: its most frequent failing reasons, numbers as #.", width)
    name_w = min(46, max([len("check"), *(len(c.name) for c in stats.checks)]))
    head = (f"{'#':>3} {'check':<{name_w}} {'pts':>4} {'attempted':>10} {'judged':>7} {'pass':>5} {'discr.':>7} "
            f"{'upper fail':>11}")
    lines += ["", head, "-" * len(head)]
    for k, c in enumerate(stats.checks, 1):
        name = c.name if len(c.name) <= name_w else c.name[:name_w - 1] + "~"
        lines.append(f"{k:>3} {name:<{name_w}} {score_text(c.points):>4} {f'{c.attempted}/{stats.submissions}':>10} "
                     f"{c.judged:>7} {percent(c.pass_rate):>5} {signed(c.discrimination):>7} "
                     f"{f'{c.upper_failed}/{c.upper}':>11}")
        for reason, n in c.reasons:
            lines += textwrap.wrap(f"{n} x {reason}", width, initial_indent=" " * 8, subsequent_indent=" " * 12,
                                   break_on_hyphens=False)
    lines += ["", f"flagged ({len(stats.flags)}):" if stats.flags else "flagged: none"]
    for flag in stats.flags:
        lines += textwrap.wrap(flag.text(), width, initial_indent="  ", subsequent_indent="    ",
                               break_on_hyphens=False)
    for e in stats.experiments:
        lines += ["", f"experiment {e.name} ({e.item}): {e.attempted} attempted, {e.measured} measured, "
                      f"{e.passed} passed"]
        for m in e.metrics:
            lines += textwrap.wrap(metric_text(m), width, initial_indent="  ", subsequent_indent="    ")
    return lines


def metric_text(m):
    """'test_mse [<= 0.025]: 38 figures, min 0.019, median 0.021, max 0.09; lecture 0.0191; reference seed 0
    0.0209; 3 crowd the bound (1 under, 2 over)'."""
    spread = (f"{len(m.values)} figures, min {m.spread[0]:.4g}, median {m.spread[1]:.4g}, max {m.spread[2]:.4g}"
              if m.values else "no figures")
    reference = ", ".join(f"seed {seed} {v:.4g}" for seed, v in sorted(m.reference.items())) or "none in the cache"
    crowd = f"; {m.crowded} crowd the bound ({m.under} under, {m.over} over)" if m.bands else ""
    return (f"{m.metric}" + (f" [{m.bound}]" if m.bound else "") + f": {spread}; lecture "
            + (f"{m.lecture:g}" if m.lecture is not None else "-") + f"; reference {reference}{crowd}")

