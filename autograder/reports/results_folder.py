"""A folder of results.json files read as a class, and what the pages made from it share: reasons with their
numbers as '#', figures inline (class_report.py, check_stats.py, experiment_stats.py)."""
import base64
import io
import json
import re
from pathlib import Path

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")  # not digits of a name


def load_results(folder):
    """(name, result) for each results file under the folder, at any depth (one folder per assignment or section:
    the name is the path below `folder`, secA/alice); files that are not results, and grader failures, are
    skipped."""
    folder = Path(folder)
    rows = []
    for path in sorted(folder.rglob("*.json")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or ".ipynb_checkpoints" in rel.parts:
            continue  # the replaced results' history (.history), Jupyter's copies: not this class's results
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and isinstance(result.get("tests"), list) \
                and {"score", "max_score"} <= set(result) and not result.get("extra_data", {}).get("grader_error"):
            rows.append((rel.with_suffix("").as_posix(), result))
    return rows


def normalised(reason):
    """A reason with its numbers replaced by '#', so that the same mistake with other figures counts once."""
    return NUMBER.sub("#", reason)


def figure_png(fig):
    """A matplotlib figure as base64 PNG, which the page shows inline: the report is one self-contained file."""
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def by_assignment(rows):
    """aid -> its (name, result) rows, the assignments in sorted order."""
    by_aid = {}
    for name, result in rows:
        by_aid.setdefault(result.get("extra_data", {}).get("assignment", "?"), []).append((name, result))
    return dict(sorted(by_aid.items()))
