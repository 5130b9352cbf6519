"""Show every experiment's measured figure beside the lecture's at the end of the run, even without -s."""
FIGURES = []


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        FIGURES.extend(line for line in report.capstdout.splitlines()
                       if line.startswith("EXPERIMENT") or "(lecture " in line)


def pytest_terminal_summary(terminalreporter):
    if FIGURES:
        terminalreporter.section("experiments: measured (lecture figure, threshold)")
        for line in FIGURES:
            terminalreporter.write_line(line)
