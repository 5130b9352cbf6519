#!/usr/bin/env bash
# The system packages some tests need beyond pip's: a real single-node Slurm (tests/slurm_node.py: slurm-wlm,
# munge) and capsh (tests of the Docker-default container). Installed from Debian's registry where this runs as
# root; elsewhere it says which tests will skip for want of them and installs nothing. Never fails the test
# command: the tests themselves say why they skip, and under CI=true a skip fails the run (tests/conftest.py).
set -u
PACKAGES=(slurm-wlm munge libcap2-bin)
missing=()
for p in "${PACKAGES[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "test system packages: all installed (${PACKAGES[*]})"
elif [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "test system packages: not installed, not root or no apt-get: ${missing[*]} (tests/test_slurm.py will skip)"
else
  echo "test system packages: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/tmp/course-apt.log 2>&1 \
    || { echo "test system packages: apt-get failed (log: /tmp/course-apt.log):"; tail -5 /tmp/course-apt.log; }
fi
exit 0
