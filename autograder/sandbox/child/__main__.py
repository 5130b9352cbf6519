"""The student's side as a program: `python -I autograder/sandbox/child CONTROL_FD [IMPORT_PATH [GRADER_PID]]`, the
zygote.

This folder is loaded as the package `course_child` from its own files (load), never as part of the grader's
`autograder` package: the student's process imports nothing of the grader's.
"""
import importlib
import importlib.util
import json
import os
import sys

FOLDER = os.path.dirname(os.path.abspath(__file__))
MODULES = ("helpers", "tripwire", "fake_gpu", "server", "isolation", "monitor")


def load(name="course_child"):
    """This folder as the package `name`, its modules imported (package.server, package.tripwire, ...)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(FOLDER, "__init__.py"),
                                                      submodule_search_locations=[FOLDER])
        sys.modules[name] = package = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(package)
    for module in MODULES:
        importlib.import_module(f"{name}.{module}")
    return sys.modules[name]


if __name__ == "__main__":
    load().monitor.zygote(int(sys.argv[1]), json.loads(sys.argv[2]) if len(sys.argv) > 2 else None,
                          int(sys.argv[3]) if len(sys.argv) > 3 else None)
