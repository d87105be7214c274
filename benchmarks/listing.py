"""``python -m benchmarks.run --list``: every algorithm with its knobs and simulated clock, every task
with its target, data and hyper-parameters, and the run settings with their defaults."""

from __future__ import annotations

import algorithms
from benchmarks import tasks
from benchmarks.settings import SETTINGS


def listing() -> str:
    """``--list``: every algorithm with its knobs, every task with its hyper-parameters, the run settings."""
    lines = ["Algorithms (knobs: --set name=value):"]
    for name in algorithms.names():
        knobs = ", ".join(f"{k}={d!r}" for k, (_, d) in algorithms.params(name).items()) or "-"
        simulator = algorithms.get(name).simulator
        simulated = {"virtual": "the virtual cluster", "arrivals": "the parameter-server simulator"}.get(simulator)
        lines += [
            f"  {name:<18} {algorithms.describe(name)}",
            f"  {'':<18} knobs: {knobs}",
            f"  {'':<18} clock=simulated: {simulated or 'not yet'}",
        ]
    lines.append("\nTasks (hyper-parameters: --set name=value):")
    for name in tasks.names():
        t = tasks.get(name)
        data = f"reads --set data_root=DIR holding {t.data_hint}" if t.data_hint else "embedded, no download"
        lines += [
            f"  {name:<18} {t.description}",
            f"  {'':<18} target {t.metric} {t.target}; {data}",
            f"  {'':<18} " + ", ".join(f"{k}={v!r}" for k, v in t.hparams.items()),
        ]
    lines += ["\nRun settings:", "  " + ", ".join(f"{k}={d!r}" for k, (_, d) in SETTINGS.items())]
    return "\n".join(lines)
