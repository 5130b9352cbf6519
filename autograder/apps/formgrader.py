"""`course formgrader`: nbgrader's formgrader for this course, a Jupyter server in the course folder with
nbgrader's formgrader and the course's extension (autograder/integrations/formgrader.py); docs/TA.md."""
import os
import sys

from autograder.course.config import course_root

EXTENSIONS = ["nbgrader.server_extensions.formgrader", "autograder.integrations.formgrader"]


def formgrader(ip="127.0.0.1", port=8888):
    """Replace this process with the server (Ctrl-C stops it); it never returns."""
    root = course_root()
    argv = [sys.executable, "-m", "jupyter_server", f"--ServerApp.root_dir={root}", f"--ServerApp.ip={ip}",
            f"--ServerApp.port={port}", "--ServerApp.default_url=/formgrader", "--ServerApp.open_browser=False",
            *[f"--ServerApp.jpserver_extensions={name}=True" for name in EXTENSIONS]]
    if os.geteuid() == 0:  # a grading machine's root, as in a container: Jupyter refuses it unless told
        argv.append("--ServerApp.allow_root=True")
    print(f"formgrader for {root} on http://{ip}:{port}/formgrader (the token is in the URL Jupyter prints below; "
          f"stop with Ctrl-C)", flush=True)
    os.chdir(root)  # nbgrader reads nbgrader_config.py from the folder it runs in
    os.execv(sys.executable, argv)
