"""Workloads, the run entry point and the distributed bootstrap of the benchmark suite."""
