"""The algorithm registry: a literal dict from a name to the class that implements it.

Classes are imported lazily (``importlib``) so that ``--list`` and argument checks stay cheap and an
algorithm whose optional dependency is missing (Horovod, MPI) breaks only itself. An algorithm's
knobs are the keyword-only arguments of its constructor; ``params()`` reads them, with their
types and defaults, so that ``--set`` can reach and type-check each one.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing

from algorithms.base import Algorithm, Epoch, LoopAlgorithm, Plan
from algorithms.topology import Topology

__all__ = [
    "REGISTRY",
    "Algorithm",
    "Epoch",
    "LoopAlgorithm",
    "Plan",
    "Topology",
    "build",
    "describe",
    "get",
    "names",
    "params",
    "register",
]

# name -> "module:Class" (imported on first use) or, for one registered at run time, the class itself
REGISTRY: dict[str, str | type[Algorithm]] = {
    "ddp": "algorithms.ddp:DDP",
    "allreduce": "algorithms.allreduce:AllReduce",
    "powersgd": "algorithms.powersgd:PowerSGD",
    "horovod": "algorithms.horovod:Horovod",
    "local_sgd": "algorithms.local_sgd:LocalSGD",
    "post_local_sgd": "algorithms.local_sgd:PostLocalSGD",
    "dpsgd": "algorithms.dpsgd:DPSGD",
    "sgp": "algorithms.sgp:SGP",
    "adpsgd": "algorithms.adpsgd:ADPSGD",
    "daso": "algorithms.daso:DASO",
    "wagma": "algorithms.wagma:WAGMA",
    "diloco": "algorithms.diloco:DiLoCo",
    "lap_sgd": "algorithms.lpp_sgd:LAPSGD",
    "lpp_sgd": "algorithms.lpp_sgd:LPPSGD",
    "asgd": "algorithms.parameter_server:ASGD",
    "nag_asgd": "algorithms.parameter_server:NAGASGD",
    "multi_asgd": "algorithms.parameter_server:MultiASGD",
    "dc_asgd": "algorithms.parameter_server:DCASGD",
    "dana_zero": "algorithms.parameter_server:DANAZero",
    "dana_slim": "algorithms.parameter_server:DANASlim",
    "dana_dc": "algorithms.parameter_server:DANADC",
}


def names() -> list[str]:
    return list(REGISTRY)


def register(name: str, cls: type[Algorithm] | str) -> None:
    """Make ``cls`` (or ``"module:Class"``) runnable as ``--algorithm name``: the runner, the config
    checks and ``--list`` see it; ranks forked by the local launcher inherit the registration."""
    if name in REGISTRY:
        raise ValueError(f"algorithm {name!r} is registered already")
    REGISTRY[name] = cls


def get(name: str) -> type[Algorithm]:
    """The class registered as ``name``; an unknown name lists the valid ones."""
    if name not in REGISTRY:
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown algorithm {name!r}.{hint} Valid algorithms: {', '.join(names())}.")
    target = REGISTRY[name]
    if not isinstance(target, str):
        return target
    module_name, attr = target.split(":")
    return getattr(importlib.import_module(module_name), attr)


def params(name: str) -> dict[str, tuple[object, object]]:
    """``{knob: (type, default)}`` for the keyword-only constructor arguments of ``name`` that it
    reads (``Algorithm.own_knobs`` where set)."""
    cls = get(name)
    hints = typing.get_type_hints(cls.__init__)
    signature = inspect.signature(cls.__init__)
    return {
        p.name: (hints[p.name], p.default)
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and (cls.own_knobs is None or p.name in cls.own_knobs)
    }


def owners(knob: str) -> list[str]:
    """The registered algorithms that have ``knob``: where a run's algorithm does not, who does."""
    return [name for name in REGISTRY if knob in params(name)]


def build(name: str, topology: Topology, **knobs: object) -> Algorithm:
    return get(name)(topology, **knobs)


def describe(name: str) -> str:
    """First line of the class docstring, for ``--list``."""
    doc = inspect.getdoc(get(name)) or ""
    return doc.splitlines()[0] if doc else ""
