"""What a TA reads when the grader fails: `grader error` in the table, one line per cause, the help of every option."""
import argparse

from autograder.batch.run import failed_result, write_error_log
from autograder.cli import build_parser
from autograder.course.mnist import MnistMissing
from autograder.errors import GraderError, setup_problem
from autograder.reports.tables import grade_table, grader_error_lines, reason_lines

AID = "lab14_transformers"
MISSING = "MNIST not found: no IDX files in /x; set COURSE_MNIST_DIR"


def scored(score, max_score):
    return {"score": score, "max_score": max_score, "output": "", "tests": [
        {"item": "a", "name": "a: values", "score": score, "max_score": max_score, "output": ""}],
        "extra_data": {"assignment": AID}}


def rows():
    return [("alice", failed_result(AID, "alice", f"the grader failed ({MISSING})", cause=MISSING, setup=True,
                                     trace="Traceback (most recent call last):\n  alice's frames\n")),
            ("bob", failed_result(AID, "bob", f"the grader failed ({MISSING})", cause=MISSING, setup=True,
                                  trace="Traceback (most recent call last):\n  bob's frames\n")),
            ("carol", failed_result(AID, "carol", "the grader failed in suite::x: KeyError: 'k'\nmore lines")),
            ("dave", scored(1, 2))]


def test_a_submission_the_grader_failed_on_reads_grader_error_not_a_score():
    table = grade_table(rows(), ["a"], {"a": 2})
    lines = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] in (["alice"], ["dave"])}
    assert lines["alice"].split()[1:] == ["grader", "error"] and "0/0" not in table and " - " not in lines["alice"]
    assert lines["dave"].split()[1:] == ["1", "1/2"]
    assert reason_lines("alice", rows()[0][1]) == []  # the batch's cause line says it, not each row


def test_one_line_per_cause_naming_the_submissions_and_the_log(tmp_path):
    log = write_error_log(rows(), tmp_path)
    lines = grader_error_lines(rows(), log)
    assert len(lines) == 2, lines
    assert lines[0].startswith("grader error, 2 of 4 not scored (alice, bob): " + MISSING)
    assert lines[1].startswith("grader error, 1 of 4 not scored (carol): the grader failed in suite::x: KeyError")
    assert "a failure of the grader itself" in lines[1] and "a failure of the grader itself" not in lines[0]
    assert all(line.endswith(f"[tracebacks: {log}]") and "\n" not in line for line in lines)
    text = log.read_text()
    assert "alice's frames" in text and "bob's frames" in text and "=== carol:" in text
    assert write_error_log([rows()[-1]], tmp_path / "none") is None  # nothing failed: no log


def test_the_setup_problem_behind_a_grader_error_is_found_through_the_chain():
    try:
        try:
            raise MnistMissing(MISSING)
        except MnistMissing as e:
            raise GraderError("experiment ae_mnist: the grader's data step raised ...") from e
    except GraderError as outer:
        assert str(setup_problem(outer)) == MISSING
    assert setup_problem(GraderError("a suite bug")) is None


def test_every_option_of_every_verb_has_a_help_line():
    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"grade", "demo", "doctor", "report", "release", "export"} <= set(verbs)
    commands = {verb: sub for verb, sub in verbs.items()}
    for verb, sub in verbs.items():  # `course export grades`, `course export gradescope`
        for a in sub._actions:
            if isinstance(a, argparse._SubParsersAction):
                commands.update({f"{verb} {target}": nested for target, nested in a.choices.items()})
    missing = [f"course {verb} {a.option_strings or a.dest}" for verb, sub in commands.items() for a in sub._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    missing += [f"course {a.option_strings}" for a in parser._actions
                if a.option_strings and not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, missing
