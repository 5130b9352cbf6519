"""What the grader keeps in its cache folder to save each process its start (grading/cache.py code_fingerprints):
each kept value is what computing it gives, a process that finds it computes nothing, and the cache off computes it
every time."""
import json

import pytest

from autograder.grading import cache

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
    monkeypatch.setattr(cache, "_memo", None)  # a new process: nothing held, the folder's memo read
    monkeypatch.setattr(cache, "_syntax_fingerprint", unreachable)
    assert cache.code_fingerprint(SOURCE) == parsed
    with pytest.raises(AssertionError, match="computed again"):  # another text is parsed: the memo is by the text
        cache.code_fingerprint(SOURCE + "\n")


def test_a_corrupt_memo_is_parsed_over_and_the_cache_off_keeps_none(folder, monkeypatch):
    folder.mkdir()
    (folder / cache.FINGERPRINTS).write_text("{not json")
    assert cache.code_fingerprint(SOURCE) == cache._syntax_fingerprint(SOURCE)
    monkeypatch.setattr(cache, "_memo", None)
    monkeypatch.setenv("COURSE_NO_CACHE", "1")
    (folder / cache.FINGERPRINTS).unlink()
    assert cache.code_fingerprint(SOURCE) == cache._syntax_fingerprint(SOURCE)
    assert not (folder / cache.FINGERPRINTS).exists()
