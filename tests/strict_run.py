"""``python -m tests.strict_run ARGS``: ``python -m benchmarks.run ARGS`` with the strict device
registered (tests/strict_device.py), so that ``--set device=strict`` runs the GPU paths on the CPU."""

import sys

import tests.strict_device  # noqa: F401 - registers the device, its kernels and its process groups
from benchmarks import launcher, run

if __name__ == "__main__":
    launcher.exit_process(run.main(sys.argv[1:]))
