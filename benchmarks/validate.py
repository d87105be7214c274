"""``python -m benchmarks.validate``: the name the validation is asked for by; its code is
``benchmarks.virtual.validate`` (the virtual cluster's package), which this runs unchanged."""

import sys

from benchmarks.virtual.validate import main

if __name__ == "__main__":
    sys.exit(main())
