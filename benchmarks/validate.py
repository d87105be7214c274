"""``python -m benchmarks.validate``: the virtual cluster's validation out of sample, the command a
user runs beside ``benchmarks.run``; its code lives with the model it scores, in
``benchmarks/virtual/validate.py``."""

import sys

from benchmarks.virtual.validate import main

if __name__ == "__main__":
    sys.exit(main())
