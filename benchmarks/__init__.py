"""Workloads, the run entry point and the distributed bootstrap of the benchmark suite.

The run's exit codes live here, where the Snakefile can import them without torch: 0 completed or
diverged, 1 failed, 2 bad input, ``EXIT_TIMEOUT`` stopped at a time limit with a checkpoint.
"""

EXIT_TIMEOUT = 75  # sysexits' EX_TEMPFAIL: stopped at a time limit, checkpointed; run again to resume
