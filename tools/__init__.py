"""The measuring commands, one module each, run as ``python -m tools.<name>``: the top floor, above the
runner (``benchmarks``) and the analysis, both of which they use; nothing below imports them.

- ``calibrate``: this machine's network and batch time, fitted, and the virtual cluster against it;
- ``validate``: the virtual cluster against measurements it was not fitted to (its case file,
  ``benchmarks/validation_cases.py``, stays below, where the analysis reads it);
- ``step_time``: the runner's step on this machine, as the ``--set`` items of a simulated run;
- ``throughput``: each algorithm's step throughput against the same loop with no communication;
- ``virtual_cost``: what a simulated worker-step costs, against a real one;
- ``gloo_links``: gloo's messages over the emulated links, beside the links' own time.

``python -m benchmarks.device_check`` stays in ``benchmarks``: it is the GPU machine's first command.
"""
