"""`course export gradescope ID`: an autograder zip for Gradescope (and `otter run`), built by Otter's generate.

What the zip holds (Gradescope unpacks it at /autograder/source):
  setup.sh, run_autograder, run_otter.py,      Otter's own, from `otter generate` (Python pinned to the
  environment.yml, otter_config.json           grader's, torch and torchvision pinned to the grader's)
  tests/                                       empty: the checks are the course's hidden suites
  course/                                      the package, hidden suites, reference solutions, harness,
                                               course.yaml, the release notebook (trusted setup cells),
                                               and MNIST's test split as the offline fallback
setup.sh ends with the course's own steps: install `course/`, download MNIST (Gradescope has internet; the
copy in the zip stays the fallback), and close /autograder to all but root. Gradescope's containers have no
CAP_SYS_ADMIN, so the sandbox runs at its `uid` level there, where ownership and mode are what keep the
student's uid out of the course's files.
"""
import json
import os
import re
import tempfile
import zipfile
from pathlib import Path

import torch
import torchvision

from autograder.config import ROOT, load_course

GRADESCOPE_ROOT = "/autograder"
COURSE_DIR = "course"          # inside the zip, so /autograder/source/course on Gradescope
PACKAGES = ("autograder", "solutions")


def otter_config(aid, device="auto"):
    """Scores and reasons from the course grader; every check visible to the student, Otter's stdout not."""
    return {"lang": "python", "plugins": [{"autograder.otter_plugin.CourseGrader": {"assignment": aid, "device": device}}],
            "show_hidden": True, "show_all_public": True, "force_public_test_summary": False, "show_stdout": False,
            "print_summary": True}


def requirements():
    """The grader's own torch and torchvision, so that Gradescope trains as the course was tested."""
    return [f"torch=={torch.__version__.split('+')[0]}", f"torchvision=={torchvision.__version__.split('+')[0]}"]


def setup_steps(autograder_dir=GRADESCOPE_ROOT):
    course = f"{autograder_dir}/source/{COURSE_DIR}"
    return f"""
# --- the course's own steps (course export gradescope) ---
mamba run -n otter-env pip install -e {course}
# MNIST into the image now (Gradescope has internet here); {course}/data/mnist stays the offline fallback
mamba run -n otter-env python -c "from autograder.mnist import load_mnist; load_mnist()"
# The sandbox's uid must not reach the course (suites, solutions) but must reach the Python environment
chmod 700 {autograder_dir}
chmod 711 /root
"""


def course_files(aid):
    """(path in the zip, bytes) of everything the grader needs to grade `aid`."""
    course = load_course()
    files = [("pyproject.toml", (ROOT / "pyproject.toml").read_bytes())]
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append((str(path.relative_to(ROOT)), path.read_bytes()))
    release = ROOT / "release" / aid / f"{aid}.ipynb"
    files.append((str(release.relative_to(ROOT)), release.read_bytes()))
    config = (ROOT / "course.yaml").read_text()
    config, n = re.subn(r"(?m)^(\s*mnist_dir:\s*).*$", r"\1data/mnist", config)
    assert n == 1, "course.yaml: data.mnist_dir not found"
    files.append(("course.yaml", config.encode()))
    mnist = course.mnist_dir
    if mnist.is_dir():
        files += [(f"data/mnist/{p.name}", p.read_bytes()) for p in sorted(mnist.iterdir()) if p.is_file()]
    return [(f"{COURSE_DIR}/{name}", data) for name, data in files]


def export_gradescope(aid, out="autograder.zip", device="auto"):
    """Build the zip with `otter generate`, then add the course and its setup steps; returns its path."""
    from otter.generate import main as otter_generate
    load_course().assignment(aid)  # an unknown id is a ConfigError naming the known ones
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="course-export-") as tmp:
        tmp = Path(tmp)
        (tmp / "tests").mkdir()
        (tmp / "otter_config.json").write_text(json.dumps(otter_config(aid, device), indent=2))
        (tmp / "requirements.txt").write_text("\n".join(requirements()) + "\n")
        generated = tmp / "otter.zip"
        cwd = os.getcwd()
        os.chdir(tmp)  # otter generate looks for its default files in the working folder
        try:
            otter_generate(tests_dir=str(tmp / "tests"), output_path=str(generated),
                           config=str(tmp / "otter_config.json"), requirements=str(tmp / "requirements.txt"),
                           no_environment=True, python_version="3.11")
        finally:
            os.chdir(cwd)
        with zipfile.ZipFile(generated) as otter_zip, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            for info in otter_zip.infolist():
                data = otter_zip.read(info)
                if info.filename == "setup.sh":
                    data += setup_steps().encode()
                zf.writestr(info, data)
            zf.writestr(zipfile.ZipInfo("tests/"), b"")  # Otter copies this folder into the submission's
            for name, data in course_files(aid):
                zf.writestr(name, data)
    return out
