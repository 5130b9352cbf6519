"""The fast unit layer (`pytest tests/unit`, under a minute on two cores): the grader's parts on small fixture
notebooks (tests/unit/fixtures, one per behaviour) without a Jupyter kernel; the plugin's sessions run in this process
with pytester, one sandbox for each that has a readable notebook."""
from pathlib import Path

import pytest

FIXTURES = Path(__file__).with_name("fixtures")


@pytest.fixture
def fixture_path():
    """The path of a fixture notebook, by name."""
    def path(name):
        found = FIXTURES / name
        assert found.is_file(), found
        return found
    return path
