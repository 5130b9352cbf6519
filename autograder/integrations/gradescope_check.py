"""`course export gradescope ID --check`: grade with the zip as Gradescope builds it, not with this checkout.

Gradescope builds an image from the zip alone: the pip packages of its environment.yml, then setup.sh's
course steps (torch, `pip install -e course`, MNIST), and runs `run_autograder` as root without
CAP_SYS_ADMIN, from /, under /autograder (source/, submission/, results/, submission_metadata.json). The
rehearsal does the same here:

  1. a fresh virtual environment (the zip's Python version, no system site-packages) with environment.yml's pip
     packages, then setup.sh's course steps, `mamba run -n otter-env` dropped: pip as this machine has it set
     up (its configuration, cache and local wheels, so it works offline where those hold every package);
  2. a temporary root laid out as /autograder (the image: setup.sh's steps run once), and per submission the
     zip unpacked anew into it with the submission alone (a fresh container from that image);
  3. the zip's run_otter.py (what run_autograder runs) with that root for /autograder, from /, with only the
     environment's bin on PATH, no PYTHONPATH, a fresh HOME (no user cache), the course found in the zip's
     copy (no checkout cache), under `capsh --drop=cap_sys_admin` where this is root, so the level is `uid`;
  4. results/results.json read back: the score and the isolation level the grader recorded.

The environment is built once and reused for every submission (and, given `venv`, across rehearsals), since it
is most of the cost (PyPI's torch with its CUDA libraries, about 6 GB, as Gradescope gets it when PyTorch's CPU
index is unreachable, and here it is). What the rehearsal does differently from Gradescope, to cost less where
the grades cannot tell (each measured on a 2-core machine, tests/test_gradescope_build.py):

  - pip installs without compiling to bytecode (BUILD_ENV);
  - torch runs one thread (GRADESCOPE_THREADS), the container's, since there is no cgroup quota here to read;
  - a venv the rehearsal built in its own folder is removed once graded (6 GB), its log kept.
"""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import yaml

from autograder.integrations.gradescope import GRADESCOPE_ROOT

SETUP_MARK = "# --- the course's own steps"
MACHINE_ONLY = "chmod 711 /root"  # Gradescope's /root holds its Python; here it is this machine's: left alone
# Every pip step without bytecode: pip compiles each .py it installs (15,700 of them, torch's and otter's
# dependencies'), about 40 s of CPU. The grader, run as root as on Gradescope, compiles only what it imports
# (2,900 modules, about 10 s more in the first grading) and keeps that in __pycache__ for the next submission:
# the same grades for 30 s less CPU. pip reads PIP_NO_COMPILE=1 as --compile (1 is true for a boolean option).
BUILD_ENV = {"PIP_COMPILE": "0"}
# The container course.yaml recommends has 1 CPU (Gradescope's default half of one), so the grader
# (otter_plugin.cgroup_cpus) gives torch one thread, in the grader and the sandbox. Here no cgroup quota says so:
# torch's own variables do the same (the sandbox keeps them, sandbox_zygote.sandbox_env), and the experiment
# trains as it would there, not on every core of a machine the rest of the test suite is using.
GRADESCOPE_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def zip_text(zip_path, name):
    with zipfile.ZipFile(zip_path) as zf:
        return zf.read(name).decode()


def pip_packages(zip_path):
    """(python version, pip requirements) of the zip's environment.yml."""
    env = yaml.safe_load(zip_text(zip_path, "environment.yml"))
    deps = env["dependencies"]
    python = next(d.split("=", 1)[1] for d in deps if isinstance(d, str) and d.startswith("python="))
    pips = next((d["pip"] for d in deps if isinstance(d, dict) and "pip" in d), [])
    return python, pips


def course_steps(zip_path, root, venv):
    """setup.sh's course steps for a root other than /autograder, run with the environment's pip and python."""
    setup = zip_text(zip_path, "setup.sh")
    steps = setup[setup.index(SETUP_MARK):].replace("mamba run -n otter-env ", "")
    steps = steps.replace(GRADESCOPE_ROOT, str(root))
    return "\n".join(line for line in steps.splitlines() if line.strip() != MACHINE_ONLY)


def run(cmd, log, **kw):
    """Run a build step; a failure names the step and ends with its output."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    log.write(f"$ {cmd if isinstance(cmd, str) else ' '.join(map(str, cmd))}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise RuntimeError(f"rehearsal step failed ({done.returncode}): {cmd}\n{(done.stdout + done.stderr)[-3000:]}")
    return done


def build_venv(zip_path, venv, log):
    """A fresh environment with the zip's pip packages (its course installed later, per root)."""
    python, pips = pip_packages(zip_path)
    interpreter = shutil.which(f"python{python}") or (sys.executable if sys.version.startswith(python) else None)
    if interpreter is None:
        raise RuntimeError(f"the zip wants Python {python}; no python{python} on PATH")
    run([interpreter, "-m", "venv", str(venv)], log)
    if pips:
        run([str(venv / "bin" / "pip"), "install", *pips], log, env={**os.environ, **BUILD_ENV})
    os.chmod(venv.parent, 0o755)  # the sandbox's uid runs this environment's python, as on Gradescope
    return venv


def lay_out(zip_path, root, submission):
    """The zip and one submission (a file, or a folder's contents) laid out as /autograder is, afresh."""
    for folder in ("source", "submission", "results"):
        shutil.rmtree(root / folder, ignore_errors=True)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "source")
    (root / "submission").mkdir()
    (root / "results").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps({"id": 1, "users": [], "submission_method": "upload"}))
    submission = Path(submission)
    if submission.is_dir():
        shutil.copytree(submission, root / "submission" / submission.name)
    else:
        shutil.copy(submission, root / "submission")
    entry = root / "source" / "run_otter.py"
    entry.write_text(entry.read_text().replace(f'"{GRADESCOPE_ROOT}"', repr(str(root))))


def environment(venv, home):
    """Gradescope's environment, not this session's: no PYTHONPATH, no COURSE_* settings, a fresh HOME."""
    return {"PATH": f"{venv / 'bin'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home), "LANG": "C.UTF-8", "VIRTUAL_ENV": str(venv), **GRADESCOPE_THREADS,
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")}}  # how pip reaches packages here
    # (Gradescope's own pip needs none)


def build_environment(env):
    """setup.sh's: the grading's environment, with pip's user configuration where this machine keeps it. The fresh
    HOME hid it, and pip went to PyPI for 3 GB of CUDA wheels that this machine's own indexes hold (about 50 s of
    the rehearsal's 200, and a network that CI need not have)."""
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return {**env, **BUILD_ENV, "XDG_CONFIG_HOME": config}


def grade(zip_path, submission, venv, root, log, timeout=1800):
    """results.json (a dict) of one submission graded by the zip's own autograder in the rehearsal's environment;
    the first one in `root` runs setup.sh's course steps (the image), the others find them done."""
    first = not (root / "source").exists()
    lay_out(zip_path, root, submission)
    home = Path(tempfile.mkdtemp(prefix="home-", dir=root.parent))  # a container's: no cache from before
    env = environment(venv, home)
    if first:
        run(["bash", "-e", "-c", course_steps(zip_path, root, venv)], log, env=build_environment(env), cwd="/",
            timeout=timeout)
    command = f"exec {venv / 'bin' / 'python'} {root / 'source' / 'run_otter.py'}"
    as_gradescope = [shutil.which("capsh"), "--drop=cap_sys_admin", "--", "-c", command] \
        if os.geteuid() == 0 and shutil.which("capsh") else ["sh", "-c", command]
    done = subprocess.run(as_gradescope, capture_output=True, text=True, env=env, cwd="/", timeout=timeout)
    log.write(f"$ {' '.join(as_gradescope)}\n{done.stdout}{done.stderr}\n")
    results = root / "results" / "results.json"
    if not results.is_file():
        raise RuntimeError(f"no results.json (exit {done.returncode}): what Gradescope would show as 'the "
                           f"autograder failed to execute'\n{(done.stdout + done.stderr)[-3000:]}")
    return json.loads(results.read_text())


def rehearse(zip_path, submissions, venv=None, work=None, log=None):
    """{submission: results.json} from the zip built and run as on Gradescope; `venv` (a folder) is built when
    it does not exist and reused when it does; without one, the environment built in `work` is removed after."""
    work = Path(work or tempfile.mkdtemp(prefix="course-check-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        log = log or stack.enter_context(open(work / "rehearsal.log", "w"))
        own = venv is None
        venv = Path(venv) if venv else work / "venv"
        if not (venv / "bin" / "python").exists():
            build_venv(Path(zip_path), venv, log)
        root = work / "autograder"
        root.mkdir(exist_ok=True)
        try:
            return {str(s): grade(Path(zip_path), s, venv, root, log) for s in submissions}
        finally:
            if own:
                shutil.rmtree(venv, ignore_errors=True)


def summary(result):
    """One line: the score, and the isolation level the grader recorded (or why there is none)."""
    data = result.get("extra_data") or {}
    if "not_graded" in data:
        return f"not graded ({data['not_graded']}), score {result.get('score', 0):g}"
    tests = [t for t in result["tests"] if t.get("visibility") != "hidden"]
    score = result.get("score", sum(t["score"] for t in tests))
    return f"{score:g}/{sum(t['max_score'] for t in tests):g}, isolation {data.get('isolation', 'not recorded')}"


def check(zip_path, submissions, venv=None):
    """`course export gradescope ID --check`: print each submission's score and isolation level; 0 when every
    submission got a results.json."""
    work = Path(tempfile.mkdtemp(prefix="course-check-"))
    print(f"rehearsing {zip_path} as Gradescope builds it (log: {work / 'rehearsal.log'})", flush=True)
    with open(work / "rehearsal.log", "w") as log:
        results = rehearse(zip_path, submissions, venv=venv, work=work, log=log)
    for submission, result in results.items():
        print(f"{Path(submission).name}: {summary(result)}")
        if result.get("output"):
            print("   ", result["output"].strip().splitlines()[0][:300])
    return 0
