"""The model spread that decentralised and wait-avoiding algorithms log: checked by hand on 2 ranks."""

from __future__ import annotations

import torch
from torch import nn

from algorithms.sgp import SGP
from algorithms.topology import Topology
from tests.distributed import run_on


def _spread(rank: int, world: int) -> None:
    model = nn.Linear(2, 1, bias=False)  # 2 parameters
    with torch.no_grad():
        model.weight.fill_(2.0 * rank)  # rank 0: [0, 0], rank 1: [2, 2]; the mean is [1, 1]
    algo = SGP(Topology(rank, nodes=2, procs_per_node=1))
    algo.model = model
    # every coordinate is 1 away from the mean on both ranks: sqrt((4 x 1) / (2 ranks x 2 params)) = 1
    assert abs(algo.model_spread() - 1.0) < 1e-12


def test_model_spread_is_the_rms_distance_from_the_average():
    run_on(2, _spread)
