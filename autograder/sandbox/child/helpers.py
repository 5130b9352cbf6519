"""The grader's standalone files the student's side shares, loaded by path from the folder above.

Loaded in the zygote (monitor.zygote), once the grader's import path is set and before any sandbox exists: the
sandbox's root (or Landlock) shows no course file, and nothing here imports an autograder package.
"""
import importlib.util
import os

STATE = None     # autograder/sandbox/state.py: weights by order and shape, the grader's one copy
LANDLOCK = None  # autograder/sandbox/landlock.py: Landlock's calls
PROTOCOL = None  # autograder/sandbox/protocol.py: the messages and the value codec, the grader's own
HELPERS = {"STATE": "state.py", "LANDLOCK": "landlock.py", "PROTOCOL": "protocol.py"}
FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # autograder/sandbox


def load_helpers():
    """state.py, landlock.py and protocol.py as modules of their own (course_state, ...), from FOLDER."""
    for name, file in HELPERS.items():
        spec = importlib.util.spec_from_file_location(f"course_{name.lower()}", os.path.join(FOLDER, file))
        globals()[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
