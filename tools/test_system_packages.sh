#!/usr/bin/env bash
# The system packages some tests need beyond pip's: a real single-node Slurm (tests/slurm_node.py: slurm-wlm,
# munge), capsh (the Docker-default container's tests), and for the JupyterHub rehearsal (tests/test_hub.py) a
# browser (chromium) and the hub's proxy (configurable-http-proxy, from npm: Debian's node-configurable-http-proxy
# does not run on NodeSource's Node.js). Installed from Debian's and npm's registries where this runs as root;
# elsewhere it says which are missing and installs nothing. Never fails the test command itself: the tests say why
# they skip, and under CI=true a skip for anything but missing hardware fails the run (tests/conftest.py).
set -u
PACKAGES=(slurm-wlm munge libcap2-bin chromium)
command -v npm >/dev/null || PACKAGES+=(npm)
missing=()
for p in "${PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
command -v configurable-http-proxy >/dev/null || missing+=(configurable-http-proxy)
if [ ${#missing[@]} -eq 0 ]; then
  echo "test system packages: all installed (${PACKAGES[*]} configurable-http-proxy)"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "test system packages: missing, and not root or no apt-get: ${missing[*]} (the tests that need them skip)"
  exit 0
fi
debian=("${missing[@]/configurable-http-proxy}")
if [ -n "${debian[*]// /}" ]; then
  echo "test system packages: installing ${debian[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq ${debian[*]}; } >/tmp/course-apt.log 2>&1 \
    || { echo "test system packages: apt-get failed (log: /tmp/course-apt.log):"; tail -5 /tmp/course-apt.log; }
fi
if ! command -v configurable-http-proxy >/dev/null; then
  echo "test system packages: installing configurable-http-proxy (npm)"
  npm install -g --silent configurable-http-proxy >/tmp/course-npm.log 2>&1 \
    || { echo "test system packages: npm failed (log: /tmp/course-npm.log):"; tail -5 /tmp/course-npm.log; }
fi
exit 0
