"""Resolve one run's configuration from the command line, checked before any process starts.

Every ``--set key=value`` is looked up in three flat namespaces (the task's hyper-parameters, the
algorithm's knobs, the run settings of ``benchmarks/settings.py``); a key in none of them, a value
of the wrong type, or a setting that the run's clock ignores (``CLOCK_ONLY``) is a ``ConfigError``
whose message names the fix. Values are parsed as YAML scalars and lists, so ``lr=0.1``,
``nesterov=true`` and ``milestones=[80,120]`` all work. The workflow's matrices are resolved run by
run through ``benchmarks/matrix.py``; ``--list`` is ``benchmarks/listing.py``.
"""

from __future__ import annotations

import difflib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import algorithms
from algorithms import accelerator
from benchmarks import naming, stragglers, tasks
from benchmarks.schedule import SCHEDULES
from benchmarks.settings import CLOCK_ONLY, SETTINGS, Settings
from benchmarks.virtual import network


class ConfigError(ValueError):
    """Bad user input; the message is one line that names the fix."""


@dataclass
class RunConfig:
    algorithm: str
    task: str
    nodes: int
    procs_per_node: int
    seed: int
    out: Path
    hparams: dict[str, object] = field(default_factory=dict)
    algorithm_params: dict[str, object] = field(default_factory=dict)
    settings: Settings = field(default_factory=Settings)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def run_id(self) -> str:
        return naming.run_id(self.task, self.algorithm, self.nodes, self.procs_per_node, self.seed)

    def to_json(self) -> dict[str, object]:
        return {
            "suite": self.settings.suite,
            "run_id": self.run_id,
            "algorithm": self.algorithm,
            "task": self.task,
            "nodes": self.nodes,
            "procs_per_node": self.procs_per_node,
            "world_size": self.world_size,
            "seed": self.seed,
            "out": str(self.out),
            "hparams": self.hparams,
            "algorithm_params": self.algorithm_params,
            "settings": self.settings.to_json(),
        }


def _type_name(expected: object) -> str:
    if typing.get_origin(expected) is not None:  # list[int], str | None
        return str(expected).replace("typing.", "").replace("NoneType", "None")
    return getattr(expected, "__name__", str(expected))


def coerce(key: str, raw: str, expected: object) -> object:
    """Parse ``raw`` and check it against ``expected`` (int, float, bool, str, list[...], X | None)."""
    value = _parse(raw)
    if not _matches(value, expected):
        if _matches(raw, expected):  # a string setting whose text YAML read as something else
            return raw
        raise ConfigError(
            f"--set {key}={raw}: ``{key}`` must be {_type_name(expected)}, got {type(value).__name__} {value!r}"
        )
    if expected is float and isinstance(value, int):
        value = float(value)
    return value


def _parse(raw: str) -> object:
    """Numbers first (YAML 1.1 would read ``1e-3`` as a string), then YAML (booleans, lists, null)."""
    for number in (int, float):
        try:
            return number(raw)
        except ValueError:
            continue  # not this kind of number: try the next, then YAML
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def _matches(value: object, expected: object) -> bool:
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(expected))
    if expected is type(None):
        return value is None
    if origin is list:
        (item,) = typing.get_args(expected)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)  # type: ignore[arg-type]


# Hyper-parameters that take a fraction whatever their task's default (a warm-up of 5 of 160 epochs is
# 0.3 of a 10-epoch run's).
FRACTIONAL = {"warmup_epochs"}


def _hparam_type(default: object) -> object:
    if isinstance(default, bool):
        return bool
    if isinstance(default, float):
        return float
    if isinstance(default, int):
        return int
    if isinstance(default, list):
        return list[float] if any(isinstance(v, float) for v in default) else list[int]
    return type(default)


def resolve(
    algorithm: str,
    task: str,
    nodes: int,
    procs_per_node: int,
    seed: int,
    out: Path,
    overrides: list[str],
    check_data: bool = True,
) -> RunConfig:
    """Build the fully resolved ``RunConfig``; raise ``ConfigError`` for any bad input."""
    try:
        task_obj = tasks.get(task)
    except KeyError as error:
        raise ConfigError(f"{error.args[0]} (--task)") from None
    try:
        knobs = algorithms.params(algorithm)
    except KeyError as error:
        raise ConfigError(f"{error.args[0]} (--algorithm)") from None
    for name, value in (("--nodes", nodes), ("--procs-per-node", procs_per_node)):
        if value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value}")
    if seed < 0:
        raise ConfigError(f"--seed must be a non-negative integer, got {seed}")

    namespaces = {
        "hparams": {k: (float if k in FRACTIONAL else _hparam_type(v), v) for k, v in task_obj.hparams.items()},
        "algorithm_params": knobs,
        "settings": SETTINGS,
    }
    values = {ns: {k: d for k, (_, d) in spec.items()} for ns, spec in namespaces.items()}
    known = {k: ns for ns, spec in namespaces.items() for k in spec}
    given = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        given.append(key)
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, for example --set lr=0.1")
        if key not in known and (owners := algorithms.owners(key)):
            mine = ", ".join(knobs) or "none"
            raise ConfigError(
                f"--set {key}: algorithm {algorithm!r} has no knob {key!r}; it is a knob of "
                f"{', '.join(owners)} (the knobs of {algorithm}: {mine})"
            )
        if key not in known and (holders := [t for t in tasks.REGISTRY if key in tasks.get(t).hparams]):
            raise ConfigError(f"--set {key}: task {task!r} has no hyper-parameter {key!r}; {', '.join(holders)} have")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"--set {key}: unknown key; {hint}valid keys for task {task!r} and algorithm "
                f"{algorithm!r}: {', '.join(sorted(known))} (see --list)"
            )
        ns = known[key]
        values[ns][key] = coerce(key, raw, namespaces[ns][key][0])

    settings = Settings(**values.pop("settings"))
    config = RunConfig(algorithm, task, nodes, procs_per_node, seed, Path(out), **values, settings=settings)
    refuse_ignored(settings.clock, given, defaulted="clock" not in given)
    reason = algorithms.get(algorithm).unavailable(simulated=settings.simulated)
    if reason:
        raise ConfigError(f"algorithm {algorithm!r} is unavailable here: {reason}")
    if settings.scale_lr:  # Goyal et al.'s linear rule: lr x the batch one update averages / B
        config.hparams["lr"] = config.hparams["lr"] * lr_scale(config.algorithm, config.world_size)
    _check_values(config)  # after the scaling: min_lr is checked against the lr the run uses
    if check_data and task_obj.check_data is not None:
        root = settings.data_root
        try:
            task_obj.check_data(Path(root) if root else None)
        except tasks.DataRootError as error:
            raise ConfigError(str(error)) from None
    return config


def ignored_settings(clock: str) -> set[str]:
    """The settings a run on ``clock`` ignores: those only another clock reads (none for a value that
    is no clock, which ``_check_values`` refuses)."""
    if clock not in CLOCK_ONLY:
        return set()
    return set().union(*(keys for other, keys in CLOCK_ONLY.items() if other != clock))


def refuse_ignored(clock: str, keys: list[str], defaulted: bool = False) -> None:
    """Refuse the ``--set`` keys of ``keys`` that a run on ``clock`` would ignore: a setting with no
    effect would otherwise let a run look like what it is not (a real job "on" a simulated network).
    ``defaulted``: the run's clock is the default, not given."""
    ignored = [k for k in dict.fromkeys(keys) if k in ignored_settings(clock)]
    if ignored:
        (other,) = (c for c in CLOCK_ONLY if c != clock)
        names, default = ", ".join(ignored), " (the default)" if defaulted else ""
        raise ConfigError(
            f"--set {names}: applies only to clock={other}, and this run's clock is {clock}{default}, which "
            f"ignores {'it' if len(ignored) == 1 else 'them'}; add --set clock={other}, or leave {names} out"
        )


def lr_scale(algorithm: str, world_size: int) -> int:
    """The factor ``scale_lr`` multiplies the lr by: how many workers' gradients one update averages.

    Goyal et al.'s linear rule scales the lr with the batch one update is computed from. The
    synchronous and decentralised algorithms (``ddp``, ``allreduce``, gossip, local SGD, LAP/LPP-SGD)
    average the batches of all ``world_size`` ranks, simulated or real: the factor is ``world_size``.
    A parameter server (``Algorithm.averages_workers`` False: ASGD, NAG-ASGD, Multi-ASGD, DC-ASGD and
    the DANA variants) applies each worker's batch-B gradient as an update of its own, so its lr stays
    the single-worker one, as in the DANA paper (arXiv:1907.11612, App. A.5): the factor is 1 (world_size
    would be N on the simulated clock and N + 1 on a real run, whose world also counts the master).
    What one update averages is a property of the algorithm's update (a class attribute), not a knob.
    """
    return world_size if algorithms.get(algorithm).averages_workers else 1


def _check_values(config: RunConfig) -> None:
    """Refuse a value out of its range: the task's hyper-parameters and the algorithm's knobs
    (``_check_hparams``), then the run settings (``_check_settings``), in that order."""
    _check_hparams(config)
    _check_settings(config)


def _check_hparams(config: RunConfig) -> None:
    """The hyper-parameters, the optimizer's and schedule's among them, and the algorithm's own
    checks of its knobs against them and against the task's model."""
    h = config.hparams
    positive = ("batch_size", "epochs", "eval_every", "evals_per_epoch")
    for key in positive:
        if h[key] <= 0:
            raise ConfigError(f"--set {key}: must be positive, got {h[key]}")
    if h["evals_per_epoch"] > 1 and h["eval_every"] > 1:
        raise ConfigError(
            f"--set evals_per_epoch={h['evals_per_epoch']} evaluates within every epoch, but eval_every="
            f"{h['eval_every']} skips epochs: set eval_every=1, or evals_per_epoch=1"
        )
    if h["lr"] <= 0:
        raise ConfigError(f"--set lr: must be positive, got {h['lr']}")
    if h["schedule"] not in SCHEDULES:
        raise ConfigError(f"--set schedule: must be one of {', '.join(SCHEDULES)}, got {h['schedule']!r}")
    if h["optimizer"] not in ("sgd", "adam", "adamw"):
        raise ConfigError(f"--set optimizer: must be sgd, adam or adamw, got {h['optimizer']!r}")
    if h["optimizer"] != "sgd":
        if len(h["betas"]) != 2 or not all(0 <= b < 1 for b in h["betas"]):
            raise ConfigError(f"--set betas: must be two numbers in [0, 1), got {h['betas']}")
        if algorithms.get(config.algorithm).sgd_only:  # the virtual cluster runs the run's own optimizer
            raise ConfigError(
                f"--set optimizer={h['optimizer']}: {config.algorithm} applies its own momentum-SGD rule; "
                f"use optimizer=sgd or another algorithm"
            )
    problem = algorithms.get(config.algorithm).check(config.algorithm_params, h)
    if problem:
        raise ConfigError(problem)

    def parameter_sizes() -> list[int]:
        return [p.numel() for p in tasks.get(config.task).make_model().parameters()]

    problem = algorithms.get(config.algorithm).check_model(config.algorithm_params, parameter_sizes)
    if problem:
        raise ConfigError(problem)
    if h["optimizer"] != "sgd" and h["eps"] < 0:
        raise ConfigError(f"--set eps: must not be negative, got {h['eps']}")
    if h["schedule"] == "plateau":
        if not 0 < h["gamma"] < 1:
            raise ConfigError(f"--set gamma: the plateau schedule's factor must be in (0, 1), got {h['gamma']}")
        if h["plateau_patience"] < 0 or h["min_lr"] < 0:
            raise ConfigError("--set plateau_patience and min_lr: must not be negative")
        if h["min_lr"] >= h["lr"]:
            raise ConfigError(
                f"--set min_lr: must be below the lr ({h['lr']:g}), or the plateau schedule "
                f"never lowers it; got {h['min_lr']:g}"
            )
        if h["plateau_threshold"] >= 1:
            raise ConfigError(
                f"--set plateau_threshold: a relative improvement, must be below 1, got {h['plateau_threshold']}"
            )
    if h["schedule"] == "inverse_sqrt" and h["warmup_epochs"] < 1:
        raise ConfigError(
            "--set warmup_epochs: inverse_sqrt decays from the end of the warm-up; give it at least 1 epoch"
        )


def _check_settings(config: RunConfig) -> None:
    """The run settings: device, wandb, stragglers, the clock (and the simulated clock's time model,
    ``_check_simulated``), the emulated links, checkpoints and timeouts."""
    s = config.settings
    devices = ("auto", "cpu", "cuda", *accelerator.registered())
    if s.device not in devices:
        raise ConfigError(f"--set device: must be one of {', '.join(devices)}, got {s.device!r}")
    if s.wandb_mode not in ("offline", "online", "disabled"):
        raise ConfigError(f"--set wandb_mode: must be offline, online or disabled, got {s.wandb_mode!r}")
    if s.straggler not in stragglers.KINDS:
        raise ConfigError(f"--set straggler: must be one of {', '.join(stragglers.KINDS)}, got {s.straggler!r}")
    if s.clock not in ("wall", "simulated"):
        raise ConfigError(f"--set clock: must be wall or simulated, got {s.clock!r}")
    if s.simulated:
        _check_simulated(config)
    if s.link_queue_ms <= 0:
        raise ConfigError(f"--set link_queue_ms: a queue must hold something, got {s.link_queue_ms} (default 50)")
    if s.link_mbit < 0:
        raise ConfigError(f"--set link_mbit: must be >= 0 (0: the machine's loopback), got {s.link_mbit}")
    # Stragglers are drawn among the workers; a parameter server's master (rank 0) is none.
    workers = algorithms.get(config.algorithm).worker_count(config.world_size)
    if s.straggler in ("fixed", "slow") and not 0 < s.straggler_ranks <= workers:
        raise ConfigError(f"--set straggler_ranks: must be in 1..{workers} (the workers), got {s.straggler_ranks}")
    if s.straggler_delay_ms < 0:
        raise ConfigError(f"--set straggler_delay_ms: must be >= 0, got {s.straggler_delay_ms}")
    if s.checkpoint_every < 0:
        raise ConfigError(f"--set checkpoint_every: must be >= 0 (0: only at a stop signal), got {s.checkpoint_every}")
    if s.collective_timeout_s <= 0:
        raise ConfigError(f"--set collective_timeout_s: must be positive, got {s.collective_timeout_s}")


def _check_simulated(config: RunConfig) -> None:
    """The simulated clock's: an algorithm that has a simulator, and the time model's values."""
    s = config.settings
    if algorithms.get(config.algorithm).simulator is None:
        simulated = [name for name in algorithms.names() if algorithms.get(name).simulator]
        raise ConfigError(
            f"--set clock=simulated: algorithm {config.algorithm!r} has no simulator; "
            f"simulated algorithms: {', '.join(simulated)}"
        )
    kinds = algorithms.get(config.algorithm).simulated_stragglers
    if s.straggler not in kinds:
        raise ConfigError(f"--set clock=simulated: {config.algorithm}'s straggler must be one of {', '.join(kinds)}")
    if s.sim_model_mb < 0:
        raise ConfigError(f"--set sim_model_mb: must be >= 0 (0: the task's own model), got {s.sim_model_mb}")
    if s.sim_updater_speedup <= 0:
        raise ConfigError(f"--set sim_updater_speedup: must be positive (1: no gain), got {s.sim_updater_speedup}")
    if not 0 <= s.sim_step_cv < 1:
        raise ConfigError(
            f"--set sim_step_cv: must be in [0, 1) (0: every batch takes sim_step_ms), got {s.sim_step_cv}"
        )
    if s.sim_step_ms <= 0:
        raise ConfigError(f"--set sim_step_ms: must be positive, got {s.sim_step_ms}")
    if s.sim_inter_speed <= 0:
        raise ConfigError(f"--set sim_inter_speed: must be positive (1: the preset's link), got {s.sim_inter_speed}")
    try:
        net = network.load(s.sim_network)
    except ValueError as error:
        raise ConfigError(f"--set sim_network: {error}") from None
    for line in network.looks_like_bits(net):
        warnings.warn(f"--set sim_network={s.sim_network}: {line}", stacklevel=4)  # at resolve()'s caller


def check_launch(cfg: RunConfig, started) -> None:
    """What only the way a run was started decides, checked before it trains: ``link_mbit`` shapes the
    links of network namespaces that the local launcher makes, so it needs a plain start on this
    machine (``started`` None: under srun or mpirun the ranks are started elsewhere), root and
    ``ip netns``, and gloo on the CPU (NCCL's shared-memory paths would bypass the shaping).
    ``started`` is ``launcher.detect()``'s answer; a rank the local launcher forked is inside the
    network it made."""
    s = cfg.settings
    if s.link_mbit <= 0 or (started is not None and started.launcher == "local"):
        return
    if started is not None:
        raise ConfigError(
            f"--set link_mbit: the emulated network is for plain local starts, not under {started.launcher}; "
            "leave link_mbit out (0)"
        )
    import torch  # noqa: PLC0415

    from benchmarks import netns  # noqa: PLC0415 - only where the setting is used

    if s.device == "cuda" or (s.device == "auto" and torch.cuda.is_available()):
        raise ConfigError("--set link_mbit: the emulated network carries gloo on the CPU; add --set device=cpu")
    ok, why = netns.available()
    if not ok:
        raise ConfigError(f"--set link_mbit: no emulated network here ({why}); leave link_mbit out (0)")
