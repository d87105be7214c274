"""A run's settings: what is neither a task hyper-parameter nor an algorithm knob, as one typed object.

``Settings`` is frozen: the runner, the clocks and the recorder read its attributes, and nothing
changes them once ``benchmarks.config.resolve`` has checked them. ``SETTINGS`` is the schema that
``--set`` parses against (name -> (type, default)), read from the dataclass's own fields so the two
cannot differ. config.json writes ``Settings.to_json()``: the same keys, in the same order, as ever.
"""

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """The run settings, each with its default; ``benchmarks.config`` checks their values."""

    suite: str = "adhoc"  # groups runs in results/ and in wandb
    data_root: str | None = None  # where tasks that read from disk find their data
    wandb: bool = True
    wandb_project: str = "dp-bench"
    wandb_mode: str = "offline"  # offline | online | disabled; WANDB_MODE in the environment wins
    collective_timeout_s: float = 300.0  # wall: a collective that hangs longer fails the run
    threads: int = 0  # torch intra-op threads per process; 0 = cores / local processes
    stop_at_target: bool = False  # stop at the first evaluation that reaches the target
    device: str = "auto"  # auto (CUDA when present) | cpu | cuda
    scale_lr: bool = False  # lr is the single-worker rate: multiply it by lr_scale() (Goyal et al.)
    checkpoint_every: int = 1  # epochs between checkpoints (0: only at a stop signal); resume reads them
    straggler: str = "none"  # none | fixed | slow | gamma | gamma_het (benchmarks/stragglers.py)
    straggler_ranks: int = 1  # fixed: ranks delayed at every step; slow: the slow ranks
    straggler_delay_ms: float = 0.0  # fixed, slow: delay of each delayed rank; gamma*: mean delay
    link_mbit: float = (
        0.0  # wall, local, root: each node's ranks share one link of this rate (benchmarks/netns.py); 0: loopback
    )
    link_queue_ms: float = 50.0  # link_mbit: the longest a packet may wait in a link's queue (its FIFO's depth)
    clock: str = "wall"  # wall | simulated (one process: benchmarks/virtual/, or simulator.py for the PS family)
    sim_step_ms: float = 100.0  # simulated: mean compute time of one batch
    sim_step_source: str = "set by hand"  # simulated: where sim_step_ms comes from (a paper's figure; tools.step_time)
    sim_model_mb: float = 0.0  # simulated: charge messages as for a model of this many MB (0: the task's own)
    sim_step_cv: float = 0.0  # simulated: machine noise, the CV of each batch's time around sim_step_ms
    sim_updater_speedup: float = 1.0  # simulated: throughput of LAP/LPP's U updaters on a GPU / one process's
    sim_network: str = "juwels_booster"  # simulated: the two-level link model (benchmarks/virtual/network.py PRESETS)
    sim_inter_speed: float = 1.0  # simulated: inter-node bandwidth x and latency / this (the model's sensitivity)

    @property
    def simulated(self) -> bool:
        """Whether the run is on the simulated clock (the virtual cluster or the parameter-server simulator)."""
        return self.clock == "simulated"

    def to_json(self) -> dict[str, object]:
        """config.json's ``settings``: every setting by name, in the order above."""
        return dataclasses.asdict(self)


# The schema ``--set`` parses against: name -> (type, default), from the fields above.
SETTINGS: dict[str, tuple[object, object]] = {f.name: (f.type, f.default) for f in dataclasses.fields(Settings)}


# The settings that only one clock reads, which a run on the other clock refuses (``refuse_ignored``)
# rather than ignore in silence: the simulated clock's time model (``sim_*``) means nothing to a real
# job, and the virtual cluster's and the simulator's waits have no timeout to set.
CLOCK_ONLY: dict[str, set[str]] = {
    "simulated": {k for k in SETTINGS if k.startswith("sim_")},
    "wall": {"collective_timeout_s", "link_mbit", "link_queue_ms"},
}
