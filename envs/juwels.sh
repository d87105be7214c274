# JUWELS Booster (JSC): the module set, and the suite's venv built on top of it.
#   cd <repository root> && source envs/juwels.sh     # on a login node: pip needs the internet
# The first call builds .venv-juwels/ (a few minutes); later calls load the modules and activate it.
# Source it, do not run it: it loads modules and activates the venv in your shell, and compute jobs
# inherit that environment (the Slurm profile submits with --export=ALL).
#
# ASSUMPTIONS about module names and versions (checked against JSC's documentation of the 2025
# software stage, not on the machine; `module spider <name>` shows what a stage really has):
#   - Stages/2025 exists and provides GCC, ParaStationMPI (JSC's MPI; OpenMPI is the alternative),
#     CUDA, NCCL and Python 3.12 as modules of the GCC + ParaStationMPI toolchain;
#   - a module named PyTorch exists in the stage; it is used only with DPB_TORCH=module.
# Override any of them before sourcing: DPB_JUWELS_STAGE, DPB_JUWELS_MODULES, DPB_TORCH.
#
# torch: by default the CUDA build of torch 2.13.0 from PyPI (the version the suite is tested with;
# it bundles CUDA and NCCL libraries and uses the system's InfiniBand verbs). DPB_TORCH=module uses
# the stage's PyTorch module instead (JSC-built, usually an older version): the venv then sees it
# through --system-site-packages and pip installs everything else.

DPB_JUWELS_STAGE=${DPB_JUWELS_STAGE:-Stages/2025}
DPB_JUWELS_MODULES=${DPB_JUWELS_MODULES:-"GCC ParaStationMPI CUDA NCCL Python"}
DPB_TORCH=${DPB_TORCH:-pip}   # pip | module
DPB_VENV=${DPB_VENV:-.venv-juwels}

_dpb_juwels() {
  if [ ! -f envs/requirements-cpu.txt ]; then
    echo "error: source envs/juwels.sh from the repository root" >&2
    return 1
  fi
  if ! command -v module >/dev/null 2>&1; then
    echo "error: no 'module' command: this is not a JSC login or compute node" >&2
    return 1
  fi
  module --force purge
  # shellcheck disable=SC2086  # the module list is meant to split on spaces
  module load "$DPB_JUWELS_STAGE" $DPB_JUWELS_MODULES || {
    echo "error: loading $DPB_JUWELS_STAGE $DPB_JUWELS_MODULES failed; set DPB_JUWELS_STAGE and" \
         "DPB_JUWELS_MODULES to what 'module spider' lists" >&2
    return 1
  }
  case "$DPB_TORCH" in
    pip) ;;
    module) module load PyTorch || { echo "error: no PyTorch module in $DPB_JUWELS_STAGE; use DPB_TORCH=pip" >&2; return 1; } ;;
    *) echo "error: DPB_TORCH must be pip or module, got '$DPB_TORCH'" >&2; return 1 ;;
  esac

  if [ ! -x "$DPB_VENV/bin/python" ]; then
    echo "building $DPB_VENV on $(python3 --version) ..."
    if [ "$DPB_TORCH" = module ]; then
      python3 -m venv --system-site-packages "$DPB_VENV" || return 1
    else
      python3 -m venv "$DPB_VENV" || return 1
    fi
    "$DPB_VENV/bin/python" -m pip install --quiet --upgrade pip || return 1
    # Everything the CPU machines pin, except torch (CUDA build below or the module), PyPI's MPICH
    # (the module's MPI is the one to use) and mpi4py (built below against that MPI).
    grep -v -E '^(torch|torchvision|mpich|mpi4py)([=<> ]|$)' envs/requirements-cpu.txt > "$DPB_VENV/requirements.txt"
    "$DPB_VENV/bin/python" -m pip install --quiet -r "$DPB_VENV/requirements.txt" || return 1
    if [ "$DPB_TORCH" = pip ]; then
      "$DPB_VENV/bin/python" -m pip install --quiet torch==2.13.0 torchvision==0.28.0 || return 1
    fi
    # mpi4py compiled with the module's mpicc, so that srun'd ranks and MPI agree.
    MPICC="$(command -v mpicc)" "$DPB_VENV/bin/python" -m pip install --quiet --no-binary mpi4py mpi4py || return 1
    # Horovod (the DASO papers' baseline) against this torch and the module's MPI, with NCCL
    # operations for the GPU tensors; a failed build says so in one line and the rest works.
    DPB_VENV="$DPB_VENV" bash envs/build_horovod.sh
  fi
  # shellcheck disable=SC1091
  source "$DPB_VENV/bin/activate"

  # Compute nodes have no internet: wandb writes offline runs (`wandb sync` them from a login node).
  export WANDB_MODE=offline
  # The ranks meet at the first node's InfiniBand name (jwb0001 -> jwb0001i); benchmarks/launcher.py
  # does this on JUWELS by default, the variable makes it explicit.
  export DPB_MASTER_SUFFIX=i
  # ASSUMPTION (JSC's advice for NCCL on the Booster, not measured here): bootstrap NCCL and gloo
  # over the InfiniBand interface and give IB transfers a longer timeout.
  export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0 NCCL_IB_TIMEOUT=50
  echo "JUWELS environment: $DPB_JUWELS_STAGE $DPB_JUWELS_MODULES, torch from $DPB_TORCH," \
       "$("$DPB_VENV/bin/python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)')"
}

_dpb_juwels
