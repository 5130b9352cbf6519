"""Grade one notebook: one pytest session over the assignment's hidden suite, run in this process.

`course grade`, nbgrader's preprocessor and the Otter plugin all come here; a TA gets the same session from
`python -m pytest autograder/suites/test_<id>.py --submission NB`. In-process because a session costs
milliseconds here and a fresh interpreter seconds (importing torch); pytest is not thread-safe, so batches
run their sessions in worker processes (autograder/batch/run.py).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from autograder.errors import GraderError
from autograder.grading.plugin import GRADER_FAILED, Grading, Settings
from autograder.grading.scoring import Results
from autograder.grading.suite_files import suite_path

# The plugin by name (a course copy on PYTHONPATH has no entry point); the session's own terminal, cache and
# timeouts stay off: the caller reports, results are not reused between runs, and pytest-timeout's SIGALRM would
# fight an outer pytest's (the project's tests grade from inside one). Unraisable-exception reporting stays off
# too: it runs gc.collect() several times at the end of every session (0.4 s of a 4 s grading), for warnings
# no one reads here.
#
# The session is the grader's, never the caller's: a TA's pytest settings must not change a grade or stop it
# (`PYTEST_ADDOPTS=--color=yes`, which CI services and many shells set, named an option of the terminal plugin
# that is off here: every grading ended in a usage error). So no configuration file is read (`-c` the null
# device: nothing is searched for above the suite or the working folder, a TA's pytest.ini, tox.ini, setup.cfg or
# pyproject.toml included), no conftest.py is loaded, the rootdir is the suite's own folder, and
# without_callers_settings() keeps PYTEST_ADDOPTS and PYTEST_PLUGINS out and turns off the autoloading of
# installed plugins (PYTEST_DISABLE_PLUGIN_AUTOLOAD, read by every pytest since 6): the session's plugins are
# pytest's own and the grader's, whatever else is installed (pytest-randomly's reordering, pytest-timeout,
# Hypothesis's plugin, which costs a second of CPU per grader process to import; the smallest-case search imports
# Hypothesis itself when it runs).
IN_PROCESS = ["-p", "autograder.grading.plugin", "-p", "no:terminal", "-p", "no:cacheprovider",
              "-p", "no:unraisableexception", "-c", os.devnull, "--noconftest", "-s",
              "-W", "ignore::pytest.PytestConfigWarning"]
CALLERS_SETTINGS = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DEBUG")


@contextmanager
def without_callers_settings() -> Iterator[None]:
    """The environment of a grading session: the caller's pytest settings out, plugin autoloading off; as it was
    after (the session runs in the caller's process), PYTEST_CURRENT_TEST too, which the session sets and removes
    (an outer pytest's, when a test grades)."""
    saved = {name: os.environ.get(name)
             for name in (*CALLERS_SETTINGS, "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_CURRENT_TEST")}
    for name in CALLERS_SETTINGS:
        os.environ.pop(name, None)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class SessionErrors:
    """Why a session ended before it graded: pytest.main prints a usage error (or a plugin or conftest that would
    not load) on stderr and returns only an exit code, so the cause is kept here for the GraderError to name. These
    two hooks are called on a plugin given to pytest.main, before its configuration is parsed."""

    def __init__(self) -> None:
        self.cause: str | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_cmdline_parse(self) -> Generator[None, object, object]:
        return (yield from self._kept())

    @pytest.hookimpl(wrapper=True)
    def pytest_cmdline_main(self) -> Generator[None, object, object]:
        return (yield from self._kept())

    def _kept(self) -> Generator[None, object, object]:
        try:
            return (yield)
        except Exception as e:
            text = "; ".join(line.strip() for line in str(e).splitlines()
                             if line.strip() and not line.startswith("usage:"))
            self.cause = text if isinstance(e, pytest.UsageError) else f"{type(e).__name__}: {text}"
            raise


class NativeTracebacks:
    """pytest's long traceback of a failing check costs ~1 s of CPU, and the plugin replaces it with the checker's
    message: native ones are cheap (an empty w8l4 notebook: 7.2 -> 1.0 s). `--tb` is the terminal plugin's
    option, which is off here, so it is set on the config."""

    @staticmethod
    def pytest_configure(config: pytest.Config) -> None:
        config.option.tbstyle = "native"


def grade_notebook(path: str | Path, aid: str, items: list[str] | None = None, device: str = "auto",
                   log: Callable[[str], object] | None = None, experiments: bool = True, limits: dict | None = None,
                   threads: int | None = None, failed_elsewhere: Iterable[str] = frozenset(),
                   budget_end: float | None = None, experiments_at_once: int = 1) -> Results:
    """results.json for one notebook (a dict), never raising for anything the submission did.

    Raises GraderError when the grader's own side fails (the sandbox cannot start, a suite or a harness breaks,
    the experiments' data is missing), so that no one is given a zero for it, and KeyboardInterrupt when the
    session was interrupted. The GraderError is raised from what failed inside the session (errors.setup_problem
    finds a missing MNIST or isolation there).

    `limits` overrides course.yaml's limits for this run (a dict, e.g. {"item_seconds": 5}); `threads` caps the
    student's process's CPU threads (set when several submissions are graded at once); `experiments_at_once`: how
    many experiments may train side by side, each in its own sandbox (grading/ahead.py). `failed_elsewhere` and
    `budget_end`: for a submission graded in several sessions within a time budget (plugin.Settings).
    """
    grading = Grading(Settings(submission=Path(path), assignment=aid, device=device, items=items,
                               experiments=experiments, limits=limits, threads=threads, log=log,
                               experiments_at_once=experiments_at_once,
                               failed_elsewhere=frozenset(failed_elsewhere), budget_end=budget_end))
    suite, errors = suite_path(aid), SessionErrors()
    with without_callers_settings():
        code = pytest.main([str(suite), *IN_PROCESS, "--rootdir", str(suite.parent)],
                           plugins=[grading, NativeTracebacks, errors])
    if grading.grader_error or code == GRADER_FAILED:
        raise GraderError(grading.grader_error or "the grading session failed") from grading.grader_exception
    if code == pytest.ExitCode.INTERRUPTED:
        raise KeyboardInterrupt
    if grading.results is None:
        cause = f": {errors.cause}" if errors.cause else ""
        raise GraderError(f"the grading session ended ({getattr(code, 'name', code)}) without results{cause}")
    return grading.results
