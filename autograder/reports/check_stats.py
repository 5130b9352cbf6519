"""What the class missed, check by check, and which check to distrust: statistics of one assignment's results
folder, computed from the results alone (nothing is graded).

Per item: how many submissions attempted it. A submission did not attempt an item whose checks say it is a stub
(scoring.zero_reason: "... is not implemented yet (it raises NotImplementedError)") or whose cell is gone.
One that attempted it may still not be judged check by check: the whole item zeroed (an oracle called from a
from-scratch item, a stub it calls), or a check not run after an earlier check's problem ("not checked: ...", an
experiment's "not run: ..."). The rest are judged, and for each check:

- the pass rate among the judged;
- its discrimination: the point-biserial correlation of passing the check (1 or 0) with the rest of the score (the
  submission's total less what this check gave it), over the judged. Near +1: the check separates the class as its
  total does; near 0 or below: passing it says nothing of the rest, or goes with doing worse;
- the upper group's failure rate: of the best `upper_fraction` of the judged on the rest of the score (Kelley's
  27%), the share that fails the check;
- the most frequent failing reasons, normalised (numbers as '#'), each as the grader wrote it: the smallest
  failing case it found, where it searched for one.

Flags (course.yaml's `statistics:` sets every threshold), each with its evidence:
- fails good submissions: at least `upper_failure` of the upper group fails it, or its discrimination is at most
  `low_discrimination` (passing it goes with doing worse on the rest), or nobody passes it: a correct alternative
  it refuses, a tolerance too tight;
- nobody fails it: every judged submission passes it (the `exists` check aside: the release's signature passes it,
  so an attempted item nearly always does): it may pass wrong code too (`course check ID --mutations N` grades
  small edits of the reference against it);
- the grader's reason: at least `grader_share` of its failures (and `min_failures` of them) give one reason of
  `grader_reasons`, which names the grader or its machine rather than the student (a time limit, a memory limit,
  a killed process, CUDA);
- an experiment whose figures crowd its threshold (experiment_stats.py).
"""
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from autograder.reports.results_folder import normalised
from autograder.reports.tables import check_kind, item_reasons

STUB = "is not implemented yet (it raises NotImplementedError)"  # scoring.zero_reason's for a stub
MISSING = "no cell with grade_id"             # the item's cell was deleted: nothing of the student's to check
WHOLE_ITEM = "(the whole item scores 0)"      # zero_reason's end for an oracle used, or a stub the item calls
NOT_RUN = ("not checked: ", "not run: ")      # a check skipped after an earlier check's problem
UNATTEMPTED, ZEROED, SKIPPED, PASSED, FAILED = "unattempted", "zeroed", "skipped", "passed", "failed"
EXPERIMENT = "experiment "                    # an experiment's check kind: 'experiment memory_task'

FAILS_GOOD = "fails good submissions"
TOOTHLESS = "nobody fails it"
GRADERS_REASON = "the grader's reason"
CROWDED = "figures crowd the threshold"


@dataclass
class Flag:
    """A check or an experiment to look at: what, why (the evidence) and what to do."""
    flag: str
    subject: str    # 'item: kind', or 'experiment NAME'
    evidence: str
    hint: str

    def text(self):
        return f"{self.subject}: {self.flag}: {self.evidence}. {self.hint}"


@dataclass
class CheckStat:
    """One check (item, kind) over the class."""
    item: str
    kind: str
    points: float
    attempted: int = 0          # submissions that attempted the item
    judged: int = 0             # ... whose check ran on their own code
    passed: int = 0
    discrimination: float | None = None  # point-biserial of passing with the rest of the score
    upper: int = 0              # the upper group's size on the rest of the score
    upper_failed: int = 0
    reasons: list[tuple[str, int]] = field(default_factory=list)  # the most frequent failing reasons, normalised
    grader_reason: tuple[str, int] | None = None  # the most frequent grader_reasons label among failures, and count

    @property
    def name(self):
        return f"{self.item}: {self.kind}"

    @property
    def failed(self):
        return self.judged - self.passed

    @property
    def pass_rate(self):
        return self.passed / self.judged if self.judged else None

    @property
    def upper_failure(self):
        return self.upper_failed / self.upper if self.upper else None


@dataclass
class ItemStat:
    item: str
    attempted: int
    zeroed: int   # attempted, but the whole item zeroed (an oracle called, a stub called)


def item_status(item, tests):
    """UNATTEMPTED, ZEROED or '' (judged check by check) for one submission's tests of one item (its checks and
    experiments)."""
    outputs = [t["output"] or "" for t in tests if not check_kind(t).startswith(EXPERIMENT)] or \
              [t["output"] or "" for t in tests]
    if any(f"'{item}' {STUB}" in o or f"{MISSING} '{item}'" in o for o in outputs):
        return UNATTEMPTED
    if all(o.endswith(WHOLE_ITEM) for o in outputs):
        return ZEROED
    return ""


def check_state(status, test):
    """The check's state in one submission, given its item's status."""
    if status:
        return status
    if (test["output"] or "").startswith(NOT_RUN):
        return SKIPPED
    return PASSED if test["score"] >= test["max_score"] else FAILED


def whole_results(rows):
    """(whole, partial): the results graded on every item (the largest max_score), and the others (--items)."""
    top = max((r["max_score"] for _, r in rows), default=0)
    whole = [(n, r) for n, r in rows if r["max_score"] >= top]
    return whole, len(rows) - len(whole)


def point_biserial(passed, rest):
    """Pearson's correlation of 0/1 passing with the rest of the score; None where either does not vary."""
    n = len(passed)
    if n < 2:
        return None
    mean_p, mean_r = sum(passed) / n, sum(rest) / n
    cov = sum((p - mean_p) * (r - mean_r) for p, r in zip(passed, rest, strict=True))
    var_p = sum((p - mean_p) ** 2 for p in passed)
    var_r = sum((r - mean_r) ** 2 for r in rest)
    return cov / math.sqrt(var_p * var_r) if var_p > 0 and var_r > 1e-12 else None


def check_stats(whole, settings):
    """([ItemStat], [CheckStat]) of one assignment's whole results ((name, result) rows), in the results' order;
    `settings`: course.yaml's `statistics` (report_settings.Statistics)."""
    seen, judged = {}, {}   # (item, kind) -> CheckStat; (item, kind) -> [(passed, rest of the score)]
    items, failing, grader = {}, {}, {}  # item -> ItemStat; (item, kind) -> Counter of reasons, of grader labels
    patterns = {label: re.compile(p) for label, p in settings.grader_reasons.items()}
    for _, result in whole:
        by_item = {}
        for test in result["tests"]:
            by_item.setdefault(test["item"], []).append(test)
        reasons = {(item, kind): message for item, found in item_reasons(result).items()
                   for kinds, message in found for kind in kinds}
        for item, tests in by_item.items():
            status = item_status(item, tests)
            stat = items.setdefault(item, ItemStat(item, 0, 0))
            stat.attempted += status != UNATTEMPTED
            stat.zeroed += status == ZEROED
            for test in tests:
                key = (item, check_kind(test))
                check = seen.setdefault(key, CheckStat(item, key[1], test["max_score"]))
                state = check_state(status, test)
                check.attempted += state != UNATTEMPTED
                if state not in (PASSED, FAILED):
                    continue
                judged.setdefault(key, []).append((state == PASSED, result["score"] - test["score"]))
                if state == FAILED:
                    failing.setdefault(key, Counter())[normalised(reasons.get(key, test["output"] or ""))] += 1
                    label = next((lb for lb, p in patterns.items() if p.search(test["output"] or "")), None)
                    if label:
                        grader.setdefault(key, Counter())[label] += 1
    for key, check in seen.items():
        found = judged.get(key, [])
        check.judged, check.passed = len(found), sum(p for p, _ in found)
        check.discrimination = point_biserial([float(p) for p, _ in found], [r for _, r in found])
        ranked = sorted(found, key=lambda pr: -pr[1])  # stable: ties keep the results' (the names') order
        check.upper = math.ceil(settings.upper_fraction * len(ranked)) if ranked else 0
        check.upper_failed = sum(not p for p, _ in ranked[:check.upper])
        check.reasons = failing.get(key, Counter()).most_common(settings.reasons)
        check.grader_reason = grader[key].most_common(1)[0] if key in grader else None
    return list(items.values()), list(seen.values())


def check_flags(aid, checks, settings):
    """The flags of the module doc for each check judged on at least `min_attempted` submissions."""
    flags = []
    for c in checks:
        if c.judged < settings.min_attempted:
            continue
        top = f"; most frequent reason: {c.reasons[0][0]}" if c.reasons else ""
        if c.passed == 0:
            flags.append(Flag(FAILS_GOOD, c.name, f"none of the {c.judged} submissions judged passes it, the best "
                              f"on the rest of the score included{top}",
                              "Read its failures beside the reference: a correct answer it refuses?"))
        else:
            upper = c.upper_failure >= settings.upper_failure
            worse = c.discrimination is not None and c.discrimination <= settings.low_discrimination
            if upper or worse:
                r = "undefined" if c.discrimination is None else f"{c.discrimination:+.2f}"
                evidence = (f"{c.upper_failed} of the {c.upper} best on the rest of the score fail it"
                            + (f" ({c.upper_failure:.0%}; {settings.upper_failure:.0%} flags it)" if upper else "")
                            + f"; its discrimination is {r}"
                            + (f" ({settings.low_discrimination:+.2f} or below flags it: passing goes with doing "
                               f"worse on the rest)" if worse else ""))
                flags.append(Flag(FAILS_GOOD, c.name, evidence + top, "Read the good submissions' failures: a "
                                  "correct alternative it refuses, a tolerance too tight?"))
        if c.passed == c.judged and c.kind != "exists":
            hint = (f"It may pass wrong code: `course check {aid} --mutations 8` grades small edits of the "
                    f"reference against it" if not c.kind.startswith(EXPERIMENT) else
                    "Would a wrong model miss it? A planted training failure (tests/planted, TRAINING) tells")
            flags.append(Flag(TOOTHLESS, c.name, f"all {c.judged} submissions judged on it pass it", hint))
        if c.grader_reason and c.failed >= settings.min_failures \
                and c.grader_reason[1] >= settings.grader_share * c.failed:
            label, n = c.grader_reason
            flags.append(Flag(GRADERS_REASON, c.name, f"{n} of its {c.failed} failures are a {label}, which names "
                              f"the grader or its machine rather than the student's code",
                              "Check course.yaml's limits and the grading machine before reading these as mistakes"))
    return flags
