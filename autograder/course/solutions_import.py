"""`import solutions`: the course root's solutions/ when it has one, else the installed package's."""
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

from autograder.course.root import course_root
from autograder.errors import ConfigError


class CourseSolutions(importlib.abc.MetaPathFinder):
    """`import solutions` finds the course root's solutions/ when it has one, else the installed package.

    The reference solutions are the course's, as course.yaml and release/ are: `course sync` writes them into the
    course's notebooks, and a second clone whose instructor edited solutions/ must grade against those. Found at
    import time from course_root() (COURSE_ROOT or the working folder), which batch workers (spawned processes)
    work out the same way. Not by putting the course root on sys.path: a spawned worker would then import the
    course folder's copy of `autograder` too, and grade with other code than its parent.
    """

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "solutions":
            return None  # solutions.<aid> is found through the package's __path__, the folder chosen here
        try:
            folder = course_root() / "solutions"
        except ConfigError:
            return None
        init = folder / "__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)]) \
            if init.is_file() else None


def install() -> None:
    """Put CourseSolutions first on sys.meta_path, once per process."""
    if not any(isinstance(f, CourseSolutions) for f in sys.meta_path):
        sys.meta_path.insert(0, CourseSolutions())
