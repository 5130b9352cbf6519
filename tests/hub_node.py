"""A real JupyterHub on 127.0.0.1, as a single-server course hub runs one (docs/HUB.md): real Unix users made with
useradd and logged in with their passwords through PAM, each user's server started by the hub as that user
(LocalProcessSpawner) with this environment's Python, and configurable-http-proxy in front. Everything the hub
writes is in one folder; the users are removed and every process the hub started is ended by `close()`.

Only root can make users and start servers as them; without root, without useradd, without the proxy (Debian:
`npm install -g configurable-http-proxy`) or with a Python that other users cannot run, `why_not()` says why a
test must skip."""
import contextlib
import http.cookiejar
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbconvert
import psutil

BIN = Path(sys.executable).parent
# Jupyter's data (nbconvert's templates, which formgrader and feedback use) beside the packages: the prefix they were
# installed into, which is not this Python's where its packages come from another environment (a .pth)
JUPYTER_PATH = str(Path(nbconvert.__file__).parents[4] / "share" / "jupyter")
SERVICE = "rehearsal"  # the test's own hub service: an admin that starts servers and makes users' tokens
NBGRADER_STUDENT = ["nbgrader.server_extensions.assignment_list", "nbgrader.server_extensions.course_list",
                    "nbgrader.server_extensions.validate_assignment"]
NBGRADER_INSTRUCTOR = ["nbgrader.server_extensions.formgrader", "autograder.integrations.formgrader"]


def why_not():
    """Why a hub with real users cannot start here, or None."""
    if os.geteuid() != 0:
        return "the hub starts each user's server as that Unix user and the test makes the users: it needs root"
    tools = ("useradd", "userdel", "groupadd", "groupdel", "chpasswd", "runuser", "configurable-http-proxy", "chromium")
    missing = [t for t in tools if not shutil.which(t, path=f"{os.environ['PATH']}:/usr/sbin")]
    if missing:
        return (f"{', '.join(missing)} not found (the proxy: npm install -g configurable-http-proxy; the browser: "
                f"apt-get install chromium; .ci/run installs both as root)")
    if not (BIN / "jupyterhub-singleuser").exists() or importlib.util.find_spec("websockets") is None:
        return f"jupyterhub or websockets is not installed in {BIN.parent} (the `test` extra installs both)"
    return None


class OpenedPython:
    """The folders on the way to this Python (its interpreter, standard library and packages) that other users
    cannot enter (a pyenv under /root, mode 0700) get o+x, entering but not listing, until `close()` restores their
    modes: every user's server runs this Python, as a hub's users run the course's (docs/HUB.md installs it where
    they can). `check(user)` says whether `user` can run it with nbgrader and the course's package."""

    def __init__(self, repository):
        places = {Path(sys.executable).resolve(), Path(sys.base_prefix), Path(repository),
                  *(Path(p) for p in sys.path if p and os.path.isdir(p))}
        self.modes = {}
        for place in places:
            for folder in place.parents:
                mode = folder.stat().st_mode
                if not mode & 0o001 and folder not in self.modes:
                    self.modes[folder] = mode
                    os.chmod(folder, (mode | 0o001) & 0o7777)

    def check(self, user):
        probe = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c",
                                "import nbgrader, jupyterhub, autograder.integrations.formgrader"],
                               capture_output=True, text=True)
        assert probe.returncode == 0, f"{user} cannot run {sys.executable}: {probe.stderr.strip()[-1000:]}"

    def close(self):
        for folder, mode in self.modes.items():
            os.chmod(folder, mode & 0o7777)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(user, *argv, env=None, cwd=None, check=True):
    """A command run as `user` (runuser: their uid, groups and HOME), as a shell of theirs would run it."""
    home = pwd.getpwnam(user).pw_dir
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": home, "USER": user, "LANG": "C.UTF-8", "JUPYTER_PATH": JUPYTER_PATH,
           **(env or {})}
    proc = subprocess.run(["runuser", "-u", user, "--", "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv],
                          cwd=cwd or home, capture_output=True, text=True)
    if check and proc.returncode:
        raise AssertionError(f"as {user}: {' '.join(map(str, argv))} exited {proc.returncode}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class Users:
    """Unix users and groups made for one run, with a suffix no other run uses; `remove()` deletes them."""

    def __init__(self, homes):
        self.homes, self.suffix = Path(homes), secrets.token_hex(2)
        self.homes.mkdir(parents=True, exist_ok=True)
        os.chmod(self.homes, 0o755)
        self.users, self.groups, self.passwords = [], [], {}

    def group(self, name):
        name = f"{name}{self.suffix}"
        subprocess.run(["groupadd", name], check=True, capture_output=True)
        self.groups.append(name)
        return name

    def user(self, name, groups=()):
        """A user with a 0700 home in `homes` and a password PAM checks; returns the name."""
        name = f"{name}{self.suffix}"
        home = self.homes / name
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", "--user-group",
                        *(["--groups", ",".join(groups)] if groups else []), name], check=True, capture_output=True)
        self.users.append(name)
        os.chmod(home, 0o700)
        self.passwords[name] = secrets.token_urlsafe(12)
        subprocess.run(["chpasswd"], input=f"{name}:{self.passwords[name]}\n", text=True, check=True)
        return name

    def remove(self):
        for name in self.users:
            for proc in psutil.process_iter(["username"]):  # the hub ends the servers; anything a user left, here
                if proc.info["username"] == name:
                    proc.kill()
            subprocess.run(["userdel", "--remove", name], capture_output=True)
        for name in self.groups:
            subprocess.run(["groupdel", name], capture_output=True)


class Hub:
    """jupyterhub in `folder` on 127.0.0.1 with PAM and LocalProcessSpawner: every user's server has nbgrader's
    Assignment List, with `student_config` (a folder holding the hub's nbgrader_config.py, docs/HUB.md's
    /etc/jupyter) on JUPYTER_CONFIG_PATH; `instructors`' servers have formgrader too, which finds the course through
    their ~/.jupyter/nbgrader_config.py."""

    def __init__(self, folder, users, instructors, student_config, env=None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port, self.token = free_port(), secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        config = self.folder / "jupyterhub_config.py"
        config.write_text(self._config(users, instructors, student_config, env or {}))
        with open(self.folder / "hub.log", "w") as log:  # the hub keeps its own copy of the file
            self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=self.folder,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"})
        try:
            self._until(lambda: self._answers("/hub/api/"), "the hub did not answer")
        except BaseException:
            self.close()
            raise

    def _config(self, users, instructors, student_config, env):
        f = self.folder
        spawn_env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "JUPYTER_CONFIG_PATH": str(student_config),
                     "JUPYTER_PATH": JUPYTER_PATH, **env}
        return "\n".join([
            "c = get_config()  # noqa: F821",
            "c.JupyterHub.ip = '127.0.0.1'",
            f"c.JupyterHub.port = {self.port}",
            f"c.JupyterHub.hub_port = {free_port()}",
            f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{free_port()}'",
            f"c.ConfigurableHTTPProxy.pid_file = {str(f / 'proxy.pid')!r}",
            f"c.JupyterHub.db_url = 'sqlite:///{f / 'jupyterhub.sqlite'}'",
            f"c.JupyterHub.cookie_secret_file = {str(f / 'cookie_secret')!r}",
            "c.JupyterHub.authenticator_class = 'pam'",
            f"c.Authenticator.allowed_users = {set(users)!r}",
            "c.JupyterHub.spawner_class = 'localprocess'",
            f"c.Spawner.cmd = [{str(BIN / 'jupyterhub-singleuser')!r}]",
            f"c.Spawner.environment = {spawn_env!r}",
            "c.Spawner.start_timeout = c.Spawner.http_timeout = 120",
            f"c.JupyterHub.services = [{{'name': {SERVICE!r}, 'api_token': {self.token!r}}}]",
            f"c.JupyterHub.load_roles = [{{'name': {SERVICE!r}, 'services': [{SERVICE!r}], "
            "'scopes': ['admin:users', 'admin:servers', 'tokens', 'list:users', 'read:users']}]",
            "def per_user(spawner):",
            f"    on = {{e: True for e in {NBGRADER_STUDENT!r}}} | {{e: False for e in {NBGRADER_INSTRUCTOR!r}}}",
            f"    if spawner.user.name in {set(instructors)!r}:",
            f"        on |= {{e: True for e in {NBGRADER_INSTRUCTOR!r}}}",
            "    spawner.args = [f'--ServerApp.jpserver_extensions={e}={v}' for e, v in on.items()]",
            "c.Spawner.pre_spawn_hook = per_user",
            ""])

    def _answers(self, path):
        try:
            self.api(path)
            return True
        except (urllib.error.URLError, ConnectionError, AssertionError):  # not up yet, or the proxy before the hub
            return False

    def _until(self, ready, what, seconds=120):
        deadline = time.monotonic() + seconds
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} ({'the hub exited' if self.proc.poll() is not None else 'timed out'}):"
                                   f"\n{(self.folder / 'hub.log').read_text()[-4000:]}")
            time.sleep(0.3)

    def api(self, path, method="GET", body=None, token=None):
        """The JSON the hub (or, for /user/NAME/..., that user's server) answers, with a token."""
        request = urllib.request.Request(self.url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"token {token or self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: {e.code} {e.reason}: {e.read().decode()[-2000:]}") from None
        return json.loads(text) if text.strip() else None

    def login(self, user, password):
        """The hub's login form with PAM, as a browser posts it; the hub's answer (its redirect) as a page URL."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        opener.open(f"{self.url}/hub/login", timeout=60).read()
        xsrf = next(c.value for c in jar if c.name == "_xsrf")
        form = urllib.parse.urlencode({"username": user, "password": password, "_xsrf": xsrf}).encode()
        page = opener.open(urllib.request.Request(f"{self.url}/hub/login?next=/hub/home", data=form), timeout=60)
        return page.geturl()

    def token_of(self, user):
        """An API token of `user`'s own, as the hub's token page makes one."""
        return self.api(f"/hub/api/users/{user}/tokens", "POST", {"note": "rehearsal", "expires_in": 3600})["token"]

    def start(self, *users):
        """The users' servers started by the hub, all at once, once each answers."""
        for user in users:
            self.api(f"/hub/api/users/{user}/server", "POST", {})
        for user in users:
            self._until(lambda user=user: (self.api(f"/hub/api/users/{user}")["servers"].get("") or {}).get("ready"),
                        f"{user}'s server did not start", seconds=180)

    def close(self):
        """Stop the hub (it stops the servers it started and its proxy); then anything left of them, by PID."""
        if self.proc is None:
            return
        started = psutil.Process(self.proc.pid).children(recursive=True) if self.proc.poll() is None else []
        pid_file = self.folder / "proxy.pid"
        if pid_file.exists() and pid_file.read_text().strip().isdigit():
            started.append(psutil.Process(int(pid_file.read_text())) if psutil.pid_exists(
                int(pid_file.read_text())) else None)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for proc in filter(None, started):
            if proc.is_running():
                proc.kill()

MENU_CLICK = """(() => {
  const fire = (el, type) => { const r = el.getBoundingClientRect();
    el.dispatchEvent(new (type.startsWith('pointer') ? PointerEvent : MouseEvent)(type, {bubbles: true,
      cancelable: true, view: window, button: 0, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2})); };
  const bar = [...document.querySelectorAll('.lm-MenuBar-item')].find(e => e.textContent.trim() === MENU);
  fire(bar, 'pointerdown'); fire(bar, 'mousedown');
  const item = [...document.querySelectorAll('.lm-Menu-item')].find(e => e.textContent.includes(ITEM));
  if (!item) return false;
  for (const type of ['pointermove', 'mousemove', 'pointerup', 'mouseup']) fire(item, type);
  return true; })()"""


class Browser:
    """Headless Chromium driven through its DevTools protocol: a page is opened as a user opens it, after logging
    in to the hub with the form, and read back as the text it shows once its scripts have filled it."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        self.proc = subprocess.Popen([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      f"--user-data-dir={self.folder}", "--remote-debugging-port=0", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        active = self.folder / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.2)
        port = active.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
            page = next(t for t in json.loads(response.read()) if t["type"] == "page")
        import websockets.sync.client  # the test extra's; why_not() checks it is there
        self.socket = websockets.sync.client.connect(page["webSocketDebuggerUrl"], max_size=2**26)
        self.next_id = 0

    def send(self, method, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive between the answers; only the answer to this call is wanted
            message = json.loads(self.socket.recv(timeout=120))
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression):
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def open(self, url):
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'", f"{url} did not load")

    def wait_for(self, condition, what, seconds=90):
        """Wait until the page's JavaScript `condition` holds (its scripts fetch and render after loading)."""
        deadline = time.monotonic() + seconds
        while not self.evaluate(f"Boolean({condition})"):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}; the page shows:\n{self.text()[:3000]}")
            time.sleep(0.3)

    def text(self):
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def log_in(self, hub, user, password):
        """The hub's login form, filled in and sent as a person would."""
        self.open(f"{hub.url}/hub/login")
        self.evaluate(f"document.querySelector('#username_input').value = {json.dumps(user)};"
                      f"document.querySelector('#password_input').value = {json.dumps(password)};"
                      "document.querySelector('form').submit()")
        self.wait_for("!location.pathname.endsWith('/hub/login') && document.readyState === 'complete'",
                      f"{user} was not logged in")

    def menu(self, menu, item):
        """A menu of the page's menu bar opened and one of its items chosen, with the pointer events a person's
        mouse sends (Lumino's menus answer those, not click())."""
        self.wait_for(f"[...document.querySelectorAll('.lm-MenuBar-item')].some(e => e.textContent.trim() === "
                      f"{json.dumps(menu)})", f"no menu {menu}")
        done = self.evaluate(MENU_CLICK.replace("MENU", json.dumps(menu)).replace("ITEM", json.dumps(item)))
        assert done, f"the menu {menu} has no item {item}"

    def close(self):
        with contextlib.suppress(Exception):  # the browser may be gone already
            self.socket.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
