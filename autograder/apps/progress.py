"""`course grade`'s progress on the terminal: a bar, or a plain line per submission where stderr is no terminal."""
import contextlib
import sys
import time

from autograder.reports.tables import GRADER_ERROR, not_scored


@contextlib.contextmanager
def progress_reporter(total):
    """grade_batch's progress callback: a tqdm bar on a terminal's stderr, one plain line per submission otherwise;
    a result taken from the results folder says so ('reused')."""
    t0 = time.time()

    def line(name, result, how):
        score = GRADER_ERROR if not_scored(result) else f"{result['score']:g}/{result['max_score']:g}"
        return f"{name}: {score}" + ("" if how == "graded" else f" ({how})")
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=total, unit="notebook", file=sys.stderr, dynamic_ncols=True)

        def progress(done, total, name, result, how):
            bar.set_postfix_str(line(name, result, how), refresh=False)
            bar.update(1)
        try:
            yield progress
        finally:
            bar.close()
        return

    def progress(done, total, name, result, how):
        print(f"[{done}/{total}] {line(name, result, how)} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    yield progress
