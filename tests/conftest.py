"""Shared fixtures, and every experiment's measured figure beside the lecture's at the end of the run."""
import nbformat
import pytest

FIGURES = []


def pytest_runtest_logreport(report):
    # the call's report carries what its setup printed too (a session fixture that trains prints then)
    if report.when == "call" and report.passed:
        FIGURES.extend(line for line in report.capstdout.splitlines() if line.startswith("EXPERIMENT"))


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("experiments: measured (lecture figure, threshold)")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def graded_solutions(tmp_path_factory):
    """Each assignment's complete submission (release + reference bodies), graded once with experiments.

    The experiments' results land in the grader's cache, so later gradings of the same code (the solved
    notebook, the nbgrader round trip) reuse them instead of training again.
    """
    from autograder.config import load_course
    from autograder.grade import grade_notebook
    from autograder.examples import release_notebook, solved_sources, with_cells
    from autograder.report import experiment_lines
    folder = tmp_path_factory.mktemp("solutions")
    out = {}
    for aid in load_course().assignments:
        path = folder / f"{aid}.ipynb"
        nbformat.write(with_cells(release_notebook(aid), solved_sources(aid)), path)
        out[aid] = grade_notebook(path, aid, device="cpu")
        print(f"\nsolution of {aid}: {out[aid]['score']}/{out[aid]['max_score']} in "
              f"{out[aid]['extra_data']['seconds']} s")
        for line in experiment_lines(aid, out[aid]):
            print(f"EXPERIMENT {line}")
    return out
