"""What the grader keeps in its cache folder to save each process its start (grading/cache.py code_fingerprints,
reports/written.py course_gradebook_url): each kept value is what computing it gives, a process that finds it
computes nothing, and a setting that could make it differ (the cache off, a config that reads the environment)
computes it every time."""
import json

import pytest

from autograder.grading import cache
from autograder.reports import written

SOURCE = 'def f(x):\n    """Adds one."""\n    return x + 1  # one\n'


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """An empty cache folder, and no fingerprint memo held by this process."""
    monkeypatch.setattr(cache, "cache_folders", lambda: [tmp_path / "cache"])
    monkeypatch.delenv("COURSE_NO_CACHE", raising=False)
    monkeypatch.setattr(cache, "_memo", None)
    return tmp_path / "cache"


def unreachable(*args):
    raise AssertionError("computed again, though the cache folder holds it")


def test_a_fingerprint_is_kept_and_a_later_process_parses_nothing(folder, monkeypatch):
    parsed = cache._syntax_fingerprint(SOURCE)
    assert cache.code_fingerprint(SOURCE) == parsed
    assert parsed in json.loads((folder / cache.FINGERPRINTS).read_text()).values()
    assert not list(folder.glob("*.json")), "the memo is kept apart from the runs' entries"
    monkeypatch.setattr(cache, "_memo", None)  # a new process: nothing held, the folder's memo read
    monkeypatch.setattr(cache, "_syntax_fingerprint", unreachable)
    assert cache.code_fingerprint(SOURCE) == parsed
    with pytest.raises(AssertionError, match="computed again"):  # another text is parsed: the memo is by the text
        cache.code_fingerprint(SOURCE + "\n")


def test_a_corrupt_memo_is_parsed_over_and_the_cache_off_keeps_none(folder, monkeypatch):
    (folder / cache.FINGERPRINTS).parent.mkdir(parents=True)
    (folder / cache.FINGERPRINTS).write_text("{not json")
    assert cache.code_fingerprint(SOURCE) == cache._syntax_fingerprint(SOURCE)
    monkeypatch.setattr(cache, "_memo", None)
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    (folder / cache.FINGERPRINTS).unlink()
    assert cache.code_fingerprint(SOURCE) == cache._syntax_fingerprint(SOURCE)
    assert not (folder / cache.FINGERPRINTS).exists()


def test_the_gradebook_url_is_kept_by_the_config_and_read_without_nbgrader(folder, monkeypatch):
    from autograder.notebooks import build
    named = build.gradebook_url()
    assert written.course_gradebook_url() == named
    monkeypatch.setattr(build, "gradebook_url", unreachable)
    assert written.course_gradebook_url() == named


def test_a_config_that_reads_the_environment_is_read_every_time(folder, monkeypatch, tmp_path):
    from autograder.notebooks import build
    config = tmp_path / "course" / "nbgrader_config.py"
    config.parent.mkdir()
    config.write_text('import os\nc = get_config()\nc.CourseDirectory.db_url = os.environ["GRADEBOOK"]\n')
    monkeypatch.setattr(build, "nbgrader_config", lambda root=None: config)
    for url in ("sqlite:///one.db", "sqlite:///two.db"):
        monkeypatch.setenv("GRADEBOOK", url)
        assert written.course_gradebook_url() == url
    assert not (folder / written.URLS).exists()
