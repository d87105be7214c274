#!/usr/bin/env bash
# Installs the suite into ./.venv (CPU build of torch). Idempotent: a second call is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -r envs/requirements-cpu.txt
bash envs/build_horovod.sh  # optional baseline: on failure it says so in one line and install goes on
# --- Optional, from Debian where apt-get is there and we are root:
# - a browser for the report's test (tests/analysis/test_report_browser.py opens report.html in headless
#   Chromium through Playwright): Debian's chromium, Playwright's own download is not reachable here
#   (elsewhere set CHROMIUM to a browser);
# - SimGrid, the oracle that the virtual cluster's shared-link solver is tested against
#   (tests/virtual/test_flows_simgrid.py loads Debian's module alone; skipped where it is missing).
wanted=()
command -v chromium >/dev/null 2>&1 || wanted+=(chromium)
compgen -G "/usr/lib/python3/dist-packages/simgrid*.so" >/dev/null || wanted+=(python3-simgrid)
if [ ${#wanted[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${wanted[@]}") \
    >/dev/null 2>&1 || echo "install.sh: could not install ${wanted[*]}; their tests fail or skip" >&2
fi
# --- end of the optional system packages
echo "installed into .venv: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
