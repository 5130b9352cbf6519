"""course.yaml's from-scratch oracles: the shared `oracles:` table and each assignment's own (`course new
--from-scratch` writes those), checked together: every path dotted, every `from_scratch` name listed by one of them."""
import re
from typing import Any

DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")  # module.attribute[.attribute...]


def oracle_problem(shared: dict[str, list[str]], assignments: dict[str, Any]) -> str:
    """The first problem of the oracle tables (the shared one, each assignment's own), '' when none."""
    tables = [("", shared)] + [(f"assignments.{aid}.oracles.", a.oracles) for aid, a in assignments.items()]
    for where, table in tables:
        for name, paths in table.items():
            bad = [p for p in paths if not DOTTED.fullmatch(p)]
            if not paths or bad:
                return (f"{where}{name}: needs a list of dotted paths such as torch.nn.functional.mse_loss "
                        f"(got {bad or 'none'})")
    for aid, a in assignments.items():
        for item, spec in a.items.items():
            missing = [n for n in spec.from_scratch if n not in shared and n not in a.oracles]
            if missing:
                return (f"assignments.{aid}.items.{item}.from_scratch names {', '.join(missing)}, which neither the "
                        f"assignment's `oracles` nor the course's lists (the sandbox would watch nothing for it)")
    return ""
