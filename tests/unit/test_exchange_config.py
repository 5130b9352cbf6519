"""course.yaml's `exchange` reaches nbgrader: nbgrader_config.py hands the course id and the exchange root to
nbgrader's exchange, and a bad value is an error that names the key and the file."""
import runpy

import pytest
from traitlets.config import Config

from autograder.course.config import ROOT, load_course, parse_course
from autograder.errors import ConfigError

TEXT = (ROOT / "course.yaml").read_text()


def nbgrader_settings():
    config = Config()
    runpy.run_path(str(ROOT / "nbgrader_config.py"), init_globals={"get_config": lambda: config})
    return config


def test_nbgrader_reads_the_course_id_and_the_exchange_root_from_course_yaml():
    exchange = load_course(ROOT / "course.yaml").exchange
    config = nbgrader_settings()
    assert (config.CourseDirectory.course_id, config.Exchange.root) == (exchange.course_id, exchange.root)
    assert (exchange.course_id, exchange.root) == ("attention-transformers", "/srv/nbgrader/exchange")
    assert config.Exchange.path_includes_course is True  # a student's fetched folder is <course_id>/<assignment>


def test_a_course_yaml_without_exchange_gets_the_single_server_default():
    text = TEXT[:TEXT.index("\nexchange:")] + TEXT[TEXT.index("\n# What each `from_scratch`"):]
    assert parse_course(text, "c.yaml").exchange.root == "/srv/nbgrader/exchange"


@pytest.mark.parametrize("line, key, says", [
    ("  root: srv/exchange", "exchange.root", "absolute path"),
    ("  course_id: my+course", "exchange.course_id", "should match pattern"),
    ("  course_id: ../other", "exchange.course_id", "should match pattern"),
    ("  rot: /srv/x", "exchange.rot", "unknown key"),
])
def test_a_bad_exchange_value_names_the_key_and_the_file(line, key, says):
    section = TEXT[TEXT.index("\nexchange:\n"):TEXT.index("\n\n", TEXT.index("\nexchange:\n"))]
    kept = [old for old in section.splitlines() if old.split(":")[0] != line.split(":")[0]]
    text = TEXT.replace(section, "\n".join([*kept, line]), 1)
    with pytest.raises(ConfigError, match=f"/x/course.yaml: {key}: .*{says}"):
        parse_course(text, "/x/course.yaml")
