"""The quick tier's cost, read off the test run that just ended: fails past its 3-minute budget.

The README's test command runs every test; tests/conftest.py writes each one's seconds and whether it is `slow` to
.test-durations.json. The quick tier (`pytest -m "not slow" -n auto`) runs the others: their seconds over the run's
workers is what it costs on this machine now. Printed in CI's output, so a test that makes the loop before a commit
slow is seen where it lands, without a timed assertion in a test (#60).

    python tools/quick_tier.py [--budget SECONDS] [--durations FILE]
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=180.0, help="seconds the quick tier may take (default 180)")
    parser.add_argument("--durations", type=Path, default=ROOT / ".test-durations.json")
    args = parser.parse_args(argv)
    if not args.durations.exists():
        print(f"quick tier: no durations at {args.durations}: run the test command first")
        return 1
    run = json.loads(args.durations.read_text())
    quick = {nodeid: seconds for nodeid, (seconds, slow) in run["tests"].items() if not slow}
    slow = sum(seconds for seconds, is_slow in run["tests"].values() if is_slow)
    workers = max(1, run["workers"])
    cost = run.get("start", 0.0) + sum(quick.values()) / workers
    print(f"quick tier (-m 'not slow'): {len(quick)} of {len(run['tests'])} tests, {sum(quick.values()):.0f} s of "
          f"test time on {workers} worker(s) after a {run.get('start', 0.0):.0f} s start: about {cost:.0f} s; "
          f"budget {args.budget:.0f} s "
          f"(the slow tests: {slow:.0f} s of test time)")
    for nodeid, seconds in sorted(quick.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {seconds:6.1f} s  {nodeid}")
    if cost > args.budget:
        print(f"quick tier over budget: {cost:.0f} s > {args.budget:.0f} s: make its longest tests cheaper, or mark "
              "them `slow` where what they prove is end to end")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
