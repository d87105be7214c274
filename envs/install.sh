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
echo "installed into .venv: torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
