"""`course export gradescope ID`: an autograder zip for Gradescope (and `otter run`), built by Otter's generate.

What the zip holds (Gradescope unpacks it at /autograder/source):
  setup.sh, run_autograder,                    Otter's own, from `otter generate` (Python pinned to the
  environment.yml, otter_config.json           grader's, otter-grader)
  run_otter.py                                 the course's: Otter's run through otter_plugin.run_autograder,
                                               so that every run writes a results.json
  tests/                                       empty: the checks are the course's hidden suites
  course/                                      the package, this assignment's hidden suite, reference solution
                                               and harness (none of the others'), course.yaml with this
                                               assignment alone and the `gradescope:` limits, the release
                                               notebook (trusted setup cells), MNIST's test split where the
                                               harness reads MNIST (the offline fallback), and in
                                               .grader/curves the reference's validation curves on the CPU
                                               (reference_curves: keyed as the container's grading keys them)
setup.sh ends with the course's own steps: torch and torchvision at the grader's versions (the CPU build from
PyTorch's wheel index, PyPI's where that index cannot be reached), install `course/` (its dependencies are all
grading imports), download MNIST where needed (Gradescope has internet; the copy in the zip stays the
fallback), and close /autograder to all but root. Gradescope's containers have no CAP_SYS_ADMIN, so the
sandbox runs at its `uid` level there, where ownership and mode are what keep the student's uid out of the
course's files. `course export gradescope ID --check` rehearses that build here
(autograder/integrations/gradescope_check.py).
"""
import importlib
import json
import os
import tempfile
import zipfile
from pathlib import Path

import torch
import torchvision
import yaml

from autograder.course.config import ROOT, course_root, load_course, released_notebook
from autograder.errors import ConfigError

GRADESCOPE_ROOT = "/autograder"
COURSE_DIR = "course"          # inside the zip, so /autograder/source/course on Gradescope
ZIP_MNIST = "data/mnist"       # MNIST's copy in the zip, under COURSE_DIR
GRADED_ON = "cpu"              # Gradescope's containers have no GPU: the device the reference curves are for
PACKAGES = ("autograder", "solutions")
CPU_WHEELS = "https://download.pytorch.org/whl/cpu"  # torch without CUDA: ~0.2 GB, not PyPI's ~5 GB
# The zip's entry point (Otter's own run_otter.py calls Otter's main directly): the course's wrapper writes a
# results.json whatever happens, and where the course itself cannot be imported, this file does.
RUN_OTTER = '''"""Runs Otter-Grader's autograding through the course's wrapper: every run writes a results.json."""
import json
import traceback

AUTOGRADER = "/autograder"

if __name__ == "__main__":
    try:
        from autograder.integrations.otter_plugin import run_autograder
    except BaseException:  # the image's build broke: the student still learns it is not their fault
        with open(AUTOGRADER + "/results/results.json", "w") as f:
            json.dump({"score": 0, "output": "The autograder could not start (the course's grader is not installed "
                       "in it): this is not a problem with your submission. The course staff must fix the "
                       "autograder and regrade it.", "tests": [{"name": "Grader error (staff only)", "score": 0,
                       "max_score": 0, "visibility": "hidden", "output": traceback.format_exc()}]}, f, indent=2)
        raise
    run_autograder(AUTOGRADER)
'''


def otter_config(aid, device="auto", budget_seconds=None):
    """Scores and reasons from the course grader; every check visible to the student, Otter's stdout not.
    `notebooks`: every assignment's own grade ids (identify.own_cell_ids), so that the zip, which holds `aid`
    alone, tells an upload of another assignment's notebook from `aid`'s (names the release shows already)."""
    from autograder.notebooks.identify import own_cell_ids
    plugin = {"assignment": aid, "device": device,
              "notebooks": {a: sorted(ids) for a, ids in own_cell_ids(load_course()).items()}}
    if budget_seconds is not None:
        plugin["budget_seconds"] = budget_seconds
    return {"lang": "python", "plugins": [{"autograder.integrations.otter_plugin.CourseGrader": plugin}],
            "show_hidden": True, "show_all_public": True, "force_public_test_summary": False, "show_stdout": False,
            "print_summary": True}


def requirements():
    """The grader's own torch and torchvision, so that Gradescope trains as the course was tested."""
    return [f"torch=={torch.__version__.split('+')[0]}", f"torchvision=={torchvision.__version__.split('+')[0]}"]


def uses_mnist(aid):
    """Whether the assignment's harness reads MNIST (the same test as experiments.data_key's)."""
    from autograder.grading.experiments import harness_sources
    return "load_mnist" in harness_sources(aid)[aid]


def setup_steps(autograder_dir=GRADESCOPE_ROOT, mnist=True):
    course = f"{autograder_dir}/source/{COURSE_DIR}"
    pins = " ".join(requirements())
    mnist_steps = (f"# MNIST into the image now (Gradescope has internet here); {course}/data/mnist stays the "
                   "offline fallback\n"
                   'mamba run -n otter-env python -c "from autograder.course.mnist import load_mnist; load_mnist()"\n'
                   ) if mnist else ""
    return f"""
# --- the course's own steps (course export gradescope) ---
# torch's CPU build (no GPU on Gradescope): pip prefers X+cpu to PyPI's X, and takes PyPI's where PyTorch's
# index cannot be reached (one quick retry, then a warning)
mamba run -n otter-env pip install --retries 1 --timeout 20 --extra-index-url {CPU_WHEELS} {pins}
mamba run -n otter-env pip install -e {course}
{mnist_steps}# The sandbox's uid must not reach the course (suites, solutions) but must reach the Python environment
chmod 700 {autograder_dir}
chmod 711 /root
"""


def package_folders():
    """{name: folder} of the packages the zip installs: the grader's code where it is installed, and the reference
    solutions this course grades with (its root's solutions/ when it has one: course/solutions_import.py)."""
    return {name: Path(importlib.import_module(name).__file__).parent for name in PACKAGES}


def project_file():
    """pyproject.toml, which installs the packages: beside the package's checkout (an editable install), else the
    course's (a package installed into site-packages keeps none)."""
    for folder in (ROOT, course_root()):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    raise ConfigError(f"no pyproject.toml in {ROOT} or {course_root()}: the zip needs it to install the grader")


def zip_course_yaml(course, aid):
    """course.yaml for the zip: this assignment alone, MNIST from the zip's copy, the `gradescope:` limits."""
    raw = yaml.safe_load(course.path.read_text())
    raw["assignments"] = {aid: raw["assignments"][aid]}
    raw["data"]["mnist_dir"] = ZIP_MNIST
    raw.pop("cache_dir", None)  # a folder of this site's, not the container's: its cache is the zip's course's own
    raw["limits"] = {**raw.get("limits", {}), **course.gradescope.limits.model_dump(exclude_none=True)}
    header = (f"# {course.path.name} for Gradescope, written by `course export gradescope {aid}`: this assignment "
              f"alone, with the\n# course's `gradescope.limits` as its limits (see the course's own file for what "
              f"each key means).\n")
    return header + yaml.safe_dump(raw, sort_keys=False, width=120)


def other_assignments_file(path, others, harness_modules):
    """Whether a package file is another assignment's (its suite, reference solution, or a harness module that
    `aid`'s harness does not load: harness_modules, experiments.harness_sources's names)."""
    if path.parent.name == "harness" and path.suffix == ".py" and path.stem != "__init__":
        return path.stem not in harness_modules
    return path.stem.removeprefix("test_") in others


def course_files(aid):
    """(path in the zip, bytes) of everything the grader needs to grade `aid` and nothing of the other assignments:
    the package's code, the course's files (course.yaml as loaded, COURSE_CONFIG included, cut to `aid`; the
    release; MNIST's test split where the harness reads MNIST)."""
    course = load_course()
    from autograder.grading.experiments import harness_sources
    others, harness_modules = set(course.assignments) - {aid}, set(harness_sources(aid))
    files = [("pyproject.toml", project_file().read_bytes())]
    for package, folder in package_folders().items():
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc" \
                    and not other_assignments_file(path, others, harness_modules):
                files.append((f"{package}/{path.relative_to(folder)}", path.read_bytes()))
    files.append((f"release/{aid}/{aid}.ipynb", released_notebook(aid).read_bytes()))
    files.append(("course.yaml", zip_course_yaml(course, aid).encode()))
    mnist = course.mnist_dir
    if uses_mnist(aid) and mnist.is_dir():
        files += [(f"{ZIP_MNIST}/{p.name}", p.read_bytes()) for p in sorted(mnist.iterdir()) if p.is_file()]
    return [(f"{COURSE_DIR}/{name}", data) for name, data in files]


def zip_data_source(aid, course):
    """The assignment's data source as the container's grading names it (experiments.data_source_of): the one read
    here, whose files the zip copies (the key names their content, not their folder); None when this process reads
    another folder ($COURSE_MNIST_DIR), whose curves the zip's data would not give."""
    from autograder.course.mnist import data_source
    from autograder.grading.experiments import data_source_of
    if not data_source_of(aid):
        return ""
    if Path(data_source()[1]).resolve() != course.mnist_dir:
        return None
    return data_source_of(aid)


def reference_curves(aid):
    """(files, line): the reference's validation curve of each graded experiment of `aid` that has one, for each
    of its seeds on the CPU, as cache entries (path in the zip, bytes) of the course's read-only layer
    (cache.SHIPPED), keyed as the container's grading keys them (experiments.curve_key); and one line saying what
    they are. Computed as a grading here computes them (reference_curve: from this machine's cache when it holds
    them, else trained once and cached). A container with another torch release, NumPy or Python minor version, or
    other grader code keys them otherwise (experiments.curve_libraries), and trains them again."""
    from autograder.grading.cache import SHIPPED
    from autograder.grading.experiments import curve_key, curve_libraries, has_curve, reference_curve
    course = load_course()
    data = zip_data_source(aid, course)
    if data is None:
        return [], ("reference curves: none ($COURSE_MNIST_DIR names a folder other than course.yaml's "
                    "data.mnist_dir, which the zip ships): the container trains them")
    files, shipped = [], []
    for exp in course.assignment(aid).experiments.values():
        if has_curve(aid, exp):
            for seed in exp.seeds:
                curve = reference_curve(aid, exp, seed, GRADED_ON)
                key = curve_key(aid, exp, seed, GRADED_ON, data=data)
                files.append((f"{COURSE_DIR}/{SHIPPED.as_posix()}/{key}.json", json.dumps(curve).encode()))
            shipped.append(f"{exp.name} seeds {', '.join(map(str, exp.seeds))}")
    versions = ", ".join(f"{name} {version}" for name, version in curve_libraries().items())
    return files, (f"reference curves: {len(files)} ({'; '.join(shipped) or 'no experiment has one'}), for "
                   f"{versions} on the {GRADED_ON}: a container with other versions trains them again")


def export_gradescope(aid, out="autograder.zip", device="auto"):
    """Build the zip with `otter generate`, then add the course, the reference curves (printing what they are)
    and its setup steps; returns its path."""
    from otter.generate import main as otter_generate
    course = load_course()
    course.assignment(aid)         # an unknown id is a ConfigError naming the known ones
    files = course_files(aid)      # before Otter's work: a missing release is a ConfigError naming it
    curves, shipped = reference_curves(aid)
    files += curves
    print(shipped)
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="course-export-") as tmp:
        tmp = Path(tmp)
        (tmp / "tests").mkdir()
        config = otter_config(aid, device, course.gradescope.budget_seconds)
        (tmp / "otter_config.json").write_text(json.dumps(config, indent=2))
        # torch comes from setup.sh's own step (the CPU build first), the rest from the course's dependencies
        (tmp / "requirements.txt").write_text("")
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
                    data += setup_steps(mnist=uses_mnist(aid)).encode()
                elif info.filename == "run_otter.py":
                    data = RUN_OTTER.encode()
                zf.writestr(info, data)
            zf.writestr(zipfile.ZipInfo("tests/"), b"")  # Otter copies this folder into the submission's
            for name, data in files:
                zf.writestr(name, data)
    return out
