"""The docs cannot drift from the code: README.md stays short, its links resolve, every `course` command shown in
README.md and docs/ parses with the real `course` parser, every option has a help line, and CI runs the README's
test command."""
import argparse
import contextlib
import io
import re
import shlex

import pytest

from autograder import cli
from autograder.course.config import ROOT

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


class Built(Exception):
    """Carries the parser cli.main built, stopped just before it parses anything."""

    def __init__(self, parser):
        super().__init__("parser built")
        self.parser = parser


@pytest.fixture(scope="module")
def parser():
    """The `course` command's own argparse parser, exactly as `cli.main` builds it; no verb runs."""
    def stop(self, args=None, namespace=None):
        raise Built(self)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop)
        with pytest.raises(Built) as built:
            cli.main([])
    return built.value.parser


def verbs(parser):
    """verb -> its subparser ({} for a parser without any)."""
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def code_lines(text):
    """The lines of fenced and indented code blocks."""
    lines, fenced, previous = [], False, ""
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced or (line.startswith("    ") and line.strip() and (not previous.strip() or previous in lines)):
            lines.append(line)
        previous = line
    joined = []  # a shell line continued with a trailing backslash is one command
    for line in lines:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + " " + line.strip()
        else:
            joined.append(line)
    return joined


def inline_code(text):
    return re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))


COMMAND = re.compile(r"\s*(\S*/)?course\s+\S")  # the program is `course` (or .venv/bin/course), with arguments


def course_commands(text):
    """Every `course ...` command shown: each shell command of a code line whose program is `course`, and each
    inline code span that starts with it. Returns the arguments after `course`."""
    parts = [part for line in code_lines(text) for part in re.split(r"&&|\|\||;|\|", line)] + inline_code(text)
    return [shlex.split(part, comments=True)[1:] for part in parts if COMMAND.match(part)]


def problems(parser, args):
    """What is wrong with `course ARGS`: an unknown verb, a flag no parser has, or an argument argparse refuses.
    A fragment that leaves out required arguments (`course grade --allow-unisolated`) is fine."""
    top = parser._option_string_actions
    verb = next((a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in top
                 or top[args[i - 1]].nargs == 0)), None)
    if verb not in verbs(parser):
        return [f"no verb {verb!r} (the verbs: {', '.join(verbs(parser))})"]
    sub = verbs(parser)[verb]
    known = set(top) | set(sub._option_string_actions)
    target = next((a for a in args[args.index(verb) + 1:] if a in verbs(sub)), None)  # `course export grades`
    if target is not None:
        known |= set(verbs(sub)[target]._option_string_actions)
    wrong = [f"no flag {a.split('=')[0]} in `course {verb}`" for a in args
             if a.startswith("-") and len(a) > 1 and not a[1].isdigit() and a.split("=")[0] not in known]
    if wrong:
        return wrong
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            _, unknown = parser.parse_known_args(args)
    except SystemExit:
        message = errors.getvalue().strip().splitlines()[-1]
        return [] if "the following arguments are required" in message else [message]
    return [f"arguments `course {verb}` does not take: {' '.join(unknown)}"] if unknown else []


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 120, "README.md is over 120 lines: move the detail to docs/"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    missing = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            missing.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            missing.append(f"{target} (no such heading)")
    assert not missing, f"{page.name} links to what is not there: {missing}"


def anchors(page):
    """GitHub's anchors for a page's headings."""
    heads = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_readme_links_every_page_of_docs():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    assert not [p.name for p in PAGES if p.resolve() not in linked], "a page of docs/ no README path leads to"


def test_the_parser_is_found(parser):
    assert {"grade", "report", "release", "export", "demo"} <= set(verbs(parser))
    assert problems(parser, ["grade", "x.ipynb", "-a", "lab14_transformers", "--no-such-flag"])
    assert problems(parser, ["grade", "x.ipynb", "-a", "lab14_transformers", "--device", "tpu"])
    assert problems(parser, ["gradee", "x.ipynb"])
    assert not problems(parser, ["grade", "--allow-unisolated"])


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_course_command_shown_parses(parser, page):
    commands = course_commands(page.read_text())
    wrong = {" ".join(args): why for args in commands if (why := problems(parser, args))}
    assert not wrong, f"{page.name}: commands the `course` CLI does not accept: {wrong}"


def test_the_readme_shows_commands():
    shown = {args[0] for args in course_commands(README.read_text()) if args}
    assert {"demo", "grade", "release", "export", "doctor"} <= shown, shown


def test_every_option_has_a_help_line(parser):
    bare = [f"course {'' if name is None else name + ' '}{action.option_strings[0]}"
            for name, p in [(None, parser), *verbs(parser).items()]
            for action in p._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)
            and (not action.help or action.help == argparse.SUPPRESS)]
    assert not bare, f"options without a help line in `course ... --help`: {bare}"


def test_every_verb_has_a_help_line(parser):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {a.dest for a in action._choices_actions if a.help}
    assert set(verbs(parser)) <= helped, set(verbs(parser)) - helped


def test_ci_runs_the_readme_test_command():
    """.ci/run ends with the README's test command, after a root-only block that installs the hub test's tools."""
    tests = [line.strip() for line in code_lines(README.read_text())
             if line.strip().startswith("python3.11 -m venv") and "pytest" in line]
    assert len(tests) == 1, f"README.md should show one test command, found {tests}"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert ci[-1:] == tests, f".ci/run runs {ci[-1:]}, README.md's test command is {tests}"
    # before it, only what the JupyterHub rehearsal needs from outside PyPI, installed where CI is root
    before = ci[:-1]
    assert not before or (before[0] == 'if [ "$(id -u)" = 0 ]; then' and before[-1] == "fi"), before
