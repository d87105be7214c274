"""DASO: the merge formula (arXiv:2104.05588, Eq. 2), the event timeline of Heat 1.0.0's `DASO.step`,
equal models at every epoch end, the B/S schedule on a synthetic plateau (and held fixed, as the
papers' Table 2), and training on the virtual cluster."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import algorithms
from algorithms.daso import DASO, PlateauDetector, batch_events, merge
from algorithms.topology import Topology
from benchmarks.tasks import digits
from tests.distributed import run_on

ROOT = Path(__file__).resolve().parents[2]


def test_merge_formula_on_hand_checkable_numbers():
    # S = 1, two nodes: (2 * 10 + (4 + 6)) / (2 + 2) = 7.5
    assert torch.equal(
        merge(torch.tensor([10.0]), torch.tensor([10.0]), staleness=1, group_size=2), torch.tensor([7.5])
    )
    # S = 4, four nodes: (8 * 1 + 12) / (8 + 4) = 20 / 12
    assert torch.allclose(merge(torch.tensor([1.0]), torch.tensor([12.0]), 4, 4), torch.tensor([20 / 12]))
    # S = 0 weighs the local copy 1, as Heat: (3 + 9) / (1 + 2) = 4
    assert torch.equal(merge(torch.tensor([3.0]), torch.tensor([9.0]), 0, 2), torch.tensor([4.0]))


def timeline(B: int, S: int, batches: int, groups: int = 4, heat_quirks: bool = True):
    """Sends, merges and blocking averages of one epoch, as (batch, group) pairs."""
    rot, pending, out = 0, None, {"send": [], "merge": [], "average": []}
    for t in range(batches):
        events, rot, pending = batch_events(t, batches - 1, B, S, rot, pending, groups, heat_quirks)
        for e in events:
            out[e.kind].append((t, e.k))
    assert pending is None, "nothing may stay in flight past the epoch"
    return out


# Heat 1.0.0 `DASO.step` (heat/optim/dp_optimizer.py), traced for G = 4 and epochs of 10 batches: sends
# and merges before the last batch (our reading of the cycling steps, arXiv:2104.05588 Fig. 5).
SPEC_TIMELINE = {
    (1, 1): (list(range(9)), list(range(1, 9))),
    (2, 1): ([0, 2, 4, 6, 8], [2, 4, 6, 8]),
    (2, 2): ([0, 2, 4, 6, 8], [2, 4, 6, 8]),
    (4, 1): ([0, 4, 8], [1, 5]),
    (4, 2): ([0, 4, 8], [2, 6]),
    (4, 4): ([0, 4, 8], [4, 8]),
    (8, 4): ([0, 8], [4]),
}


@pytest.mark.parametrize("bs", sorted(SPEC_TIMELINE))
def test_timeline_equals_the_spec_table(bs):
    sends, merges = SPEC_TIMELINE[bs]
    out = timeline(*bs, batches=10)
    assert [t for t, _ in out["send"] if t < 9] == sends
    assert [t for t, _ in out["merge"] if t < 9] == merges
    assert out["send"][-1][0] == 9 and out["average"][-1][0] == 9  # the epoch ends in a blocking average
    assert [k for _, k in out["send"]] == [i % 4 for i in range(len(out["send"]))]  # the groups rotate


def test_blocking_rows_of_the_spec_table():
    warm = timeline(0, 0, 10)
    assert [t for t, _ in warm["average"]] == list(range(10)) and not warm["send"]
    assert [k for _, k in warm["average"]] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    for B in (1, 4):  # S = 0: every send is averaged, blocking, in the same batch
        out = timeline(B, 0, 10)
        assert [t for t, _ in out["send"]] == [t for t, _ in out["average"]] and not out["merge"]


def test_clean_reading_merges_exactly_s_batches_later():
    out = timeline(2, 1, 10, heat_quirks=False)
    assert [t for t, _ in out["merge"] if t < 9] == [1, 3, 5, 7]


@pytest.mark.parametrize("groups", [2, 4])
def test_every_send_is_merged_or_averaged_once_over_a_grid(groups):
    for B in (1, 2, 3, 4, 8, 16):
        for S in range(B + 1):
            for batches in range(2, 41):
                for quirks in (True, False):
                    out = timeline(B, S, batches, groups, quirks)
                    finished = len(out["merge"]) + sum(1 for t, _ in out["average"])
                    assert finished == len(out["send"]), (B, S, batches, quirks)
                    assert out["average"][-1][0] == batches - 1


def test_plateau_detector_fires_on_the_third_stable_epoch():
    p = PlateauDetector(threshold=0.05, patience=2)
    # 0.9 is the best; 0.89, 0.88, 0.87 improve by less than 5 %: the third fires, then again three later.
    assert [p.step(x) for x in (1.0, 0.9, 0.89, 0.88, 0.87, 0.87, 0.87, 0.87, 0.80)] == [
        False,
        False,
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]


def test_b_and_s_react_to_a_synthetic_plateau():
    algo = DASO(Topology(0, nodes=2, procs_per_node=2), sync_warmup_epochs=2, sync_cooldown_epochs=2)
    algo.plan = algorithms.Plan(steps_per_epoch=10, epochs=20)
    losses = [2.0, 1.0, 0.5, 0.25] + [0.25] * 16  # improving, then flat from epoch 4 on
    states = []
    for loss in losses:
        algo.end_epoch(loss)
        states.append((algo.B, algo.S, algo.phase))
    assert states[0] == (0, 0, "warmup")
    assert states[1] == (4, 1, "cycling") and states[3] == (4, 1, "cycling")
    # Flat from epoch 5 (index 4): plateaus fire on the 3rd, 6th, 9th stable epochs: 4 -> 2 -> 1 -> 4.
    assert [s[0] for s in states[4:16]] == [4, 4, 2, 2, 2, 1, 1, 1, 4, 4, 4, 2]
    assert states[-2:] == [(0, 0, "cooldown"), (0, 0, "cooldown")]


def _b_and_s_per_epoch(**knobs) -> list[tuple[int, int, str]]:
    """(B, S, phase) of each of 12 epochs of 10 batches, one warm-up and one cool-down epoch, the
    training loss flat from the first epoch on: plateaus fire at epochs 4, 7 and 10."""
    algo = DASO(Topology(0, nodes=2, procs_per_node=2), sync_warmup_epochs=1, sync_cooldown_epochs=1, **knobs)
    algo.plan = algorithms.Plan(steps_per_epoch=10, epochs=12)
    states = [(algo.B, algo.S, algo.phase)]
    for _ in range(11):
        algo.end_epoch(1.0)
        states.append((algo.B, algo.S, algo.phase))
    return states


@pytest.mark.parametrize(
    "S, sends, merges, averages",
    [
        (1, [0, 4, 8, 9], [1, 5, 9], [9]),  # each send merged a batch later; 8's at the epoch-end send
        (0, [0, 4, 8, 9], [], [0, 4, 8, 9]),  # Table 2's S = 0: every send averaged, blocking, at once
    ],
)
def test_fixed_cycle_holds_b_and_s_through_plateaus(S, sends, merges, averages):
    """Table 2's runs: B = 4 and S as given in every cycling epoch,
    where the same flat loss halves B at epochs 4 and 7 and resets it at 10 without the knob."""
    free = _b_and_s_per_epoch(max_global_skips=4, batches_to_wait=S)
    assert [b for b, _, _ in free] == [0, 4, 4, 4, 2, 2, 2, 1, 1, 1, 4, 0]  # the losses do plateau
    fixed = _b_and_s_per_epoch(max_global_skips=4, batches_to_wait=S, fixed_cycle=True)
    assert fixed == [(0, 0, "warmup")] + [(4, S, "cycling")] * 10 + [(0, 0, "cooldown")]
    for B, S_epoch, _ in fixed[1:-1]:
        out = timeline(B, S_epoch, batches=10)
        assert [t for t, _ in out["send"]] == sends
        assert [t for t, _ in out["merge"]] == merges
        assert [t for t, _ in out["average"]] == averages


def test_batches_to_wait_sets_s_at_each_cycle_start():
    """Without ``fixed_cycle``, S starts each cycle at ``batches_to_wait`` and halves with B; an S of
    0 stays 0. The default is the papers' S = B_max // 4 (8 // 4 = 2)."""
    assert [(b, s) for b, s, _ in _b_and_s_per_epoch(max_global_skips=8)][1:5] == [(8, 2)] * 3 + [(4, 1)]
    assert [(b, s) for b, s, _ in _b_and_s_per_epoch(max_global_skips=8, batches_to_wait=6)][1:8] == [
        *[(8, 6)] * 3,
        *[(4, 3)] * 3,
        (2, 1),
    ]
    assert {s for _, s, _ in _b_and_s_per_epoch(max_global_skips=8, batches_to_wait=0)} == {0}


@pytest.mark.parametrize("S", [5, -1, 1.5])
def test_batches_to_wait_outside_0_to_b_is_refused(S):
    with pytest.raises(ValueError, match=r"Arg ``batches_to_wait`` must be None or an integer from 0 to "):
        DASO(Topology(0, nodes=2, procs_per_node=2), max_global_skips=4, batches_to_wait=S, fixed_cycle=True)
    DASO(Topology(0, nodes=2, procs_per_node=2), max_global_skips=4, batches_to_wait=4, fixed_cycle=True)  # S = B: fine


def _equal_at_epoch_ends(rank: int, world: int) -> None:
    torch.manual_seed(rank)  # different initial models: DASO must make them equal
    model = digits.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    algo = DASO(Topology(rank, nodes=2, procs_per_node=2), sync_warmup_epochs=0, sync_cooldown_epochs=0)
    plan = algorithms.Plan(steps_per_epoch=7, epochs=3)
    train_model = algo.prepare(model, optimizer, plan)
    data = torch.Generator().manual_seed(100 + rank)
    differed = False
    for _ in range(plan.epochs):
        for t in range(plan.steps_per_epoch):
            x, y = torch.randn(8, 1, 8, 8, generator=data), torch.randint(0, 10, (8,), generator=data)
            optimizer.zero_grad()
            nn.functional.cross_entropy(train_model(x), y).backward()
            algo.step()
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gathered = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(gathered, flat)
            equal = all(torch.equal(gathered[0], g) for g in gathered)
            if t == plan.steps_per_epoch - 1:
                assert equal, "models differ at the end of an epoch"
            differed |= not equal
        algo.end_epoch(1.0)
    assert differed, "models never differed within an epoch: the test could not fail"


def test_all_models_are_equal_at_every_epoch_end():
    run_on(4, _equal_at_epoch_ends)


@pytest.mark.parametrize("layout", [("2", "2"), ("2", "1")])
def test_daso_reaches_the_digits_target(tmp_path, layout, run_command):
    nodes, ppn = layout
    out = tmp_path / "daso"
    result = subprocess.run(
        [
            *run_command,
            "--algorithm",
            "daso",
            "--task",
            "digits",
            "--nodes",
            nodes,
            "--procs-per-node",
            ppn,
            "--out",
            str(out),
            "--set",
            "wandb=false",
            "--set",
            "sync_warmup_epochs=2",
            "--set",
            "sync_cooldown_epochs=2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["time_to_target_s"] is not None
    header, *rows = (out / "metrics.csv").read_text().splitlines()
    assert header.endswith("B,S,phase,global_syncs,global_sync_bytes")
    assert "cycling" in rows[3] and "warmup" in rows[0] and "cooldown" in rows[-1]
