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
# --- Optional: a browser for the report's test (tests/test_report_browser.py opens report.html in
# headless Chromium through Playwright). Debian's chromium, because Playwright's own browser download
# is not reachable here; skipped where apt-get is missing or not root (set CHROMIUM to a browser then).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) \
    >/dev/null 2>&1 || echo "install.sh: could not install chromium; the report's browser test will fail" >&2
fi
# --- end of the optional browser step
echo "installed into .venv: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
