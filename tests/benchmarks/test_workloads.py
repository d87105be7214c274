"""The papers' remaining workloads: Cityscapes (mIoU), WMT17 (BLEU) and point-goal navigation (SPL).

Each loader reads a fixture that the test writes in the real on-disk layout (Cityscapes'
leftImg8bit/gtFine PNGs with labelIds; WMT17 as aligned plain-text files) or generates its episodes
(MiniGrid); one training step goes through the task's own loss and the metric through
``task.validate``. The metrics are checked on cases small enough to verify by hand, and one
two-process run per task goes through ``python -m benchmarks.run``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler, Subset

from benchmarks import tasks
from benchmarks.tasks import DataRootError, cityscapes, navigation, wmt17

ROOT = Path(__file__).resolve().parents[2]
CITIES = {"train": ["aachen", "bochum"], "val": ["frankfurt"]}
EN = [
    "the house is small",
    "the house is big",
    "a cat sits on the mat",
    "the dog runs in the park",
    "i like green tea",
    "we read a good book",
    "the weather is nice today",
    "she sees the old house",
]
DE = [
    "das haus ist klein",
    "das haus ist gross",
    "eine katze sitzt auf der matte",
    "der hund rennt im park",
    "ich mag gruenen tee",
    "wir lesen ein gutes buch",
    "das wetter ist heute schoen",
    "sie sieht das alte haus",
]


def write_cityscapes(root: Path, frames: int = 2, height: int = 32, width: int = 64) -> Path:
    """Frames with a road lower half (labelId 7), sky upper half (23), a car (26) and unlabeled pixels (0)."""
    rng = np.random.default_rng(0)
    for split, cities in CITIES.items():
        for city in cities:
            for n in range(frames):
                stem = f"{city}_{n:06d}_000019"
                image_dir = root / "leftImg8bit" / split / city
                label_dir = root / "gtFine" / split / city
                image_dir.mkdir(parents=True, exist_ok=True)
                label_dir.mkdir(parents=True, exist_ok=True)
                ids = np.full((height, width), 23, np.uint8)
                ids[height // 2 :] = 7
                ids[height // 2 : height // 2 + 6, 10 + n : 26 + n] = 26
                ids[:2] = 0
                rgb = (rng.integers(0, 40, (height, width, 3)) + ids[..., None] * 8).astype(np.uint8)
                Image.fromarray(rgb, "RGB").save(image_dir / f"{stem}_leftImg8bit.png")
                Image.fromarray(ids, "L").save(label_dir / f"{stem}_gtFine_labelIds.png")
                Image.fromarray(rgb, "RGB").save(label_dir / f"{stem}_gtFine_color.png")  # present, not read
    return root


def write_wmt17(root: Path) -> Path:
    folder = root / wmt17.FOLDER
    folder.mkdir(parents=True)
    (folder / "train.en").write_text("\n".join(EN * 3) + "\n", encoding="utf-8")
    (folder / "train.de").write_text("\n".join(DE * 3) + "\n", encoding="utf-8")
    (folder / "test.en").write_text("\n".join(EN[:3]) + "\n", encoding="utf-8")
    (folder / "test.de").write_text("\n".join(DE[:3]) + "\n", encoding="utf-8")
    return root


def one_step(task: tasks.Task, model: torch.nn.Module, x: object, y: object) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = task.loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


# ---- metrics on hand-made cases ------------------------------------------------------------------


def test_mean_iou_by_hand():
    target = torch.tensor([0, 0, 1, 1, 2, cityscapes.IGNORE])
    pred = torch.tensor([0, 1, 1, 1, 0, 2])
    matrix = cityscapes.confusion(pred, target, num_classes=3)
    assert matrix.tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]  # the ignored pixel is not counted
    # class 0: TP 1, union 1+1+1 = 3; class 1: TP 2, union 3; class 2: TP 0, union 1 -> (1/3 + 2/3 + 0) / 3
    assert cityscapes.mean_iou(matrix) == pytest.approx(1 / 3)
    # A class in neither truth nor prediction is left out of the mean, not counted as zero.
    assert cityscapes.mean_iou(torch.tensor([[2, 0, 0], [0, 0, 0], [0, 0, 0]])) == 1.0


def test_bleu_by_hand_with_sacrebleu():
    # 1- to 4-gram precisions 4/5, 3/4, 2/3, 1/2, no brevity penalty: (1/5) ** (1/4).
    assert wmt17.uncased_bleu(["A B C D E"], ["a b c d f"]) == pytest.approx(100 * 0.2**0.25, abs=1e-9)
    assert wmt17.uncased_bleu(["The House is Small ."], ["the house is small ."]) == pytest.approx(100.0)


def test_spl_gae_and_ppo_loss_by_hand():
    assert (
        navigation.spl(True, 4, 8) == 0.5 and navigation.spl(True, 4, 3) == 1.0 and navigation.spl(False, 4, 4) == 0.0
    )
    rewards, values = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [0.25]])
    # Episode ends at t=1: A1 = 2 - 0.25; A0 = 1 + g*0.25 - 0.5 + g*l*A1.
    a = navigation.gae(rewards, values, torch.tensor([[0.0], [1.0]]), torch.tensor([9.0]), gamma=0.5, lam=0.5)
    assert a[:, 0].tolist() == pytest.approx([1 + 0.125 - 0.5 + 0.25 * 1.75, 1.75])
    logits, value = torch.zeros(1, navigation.NUM_ACTIONS), torch.tensor([1.0])
    logp = torch.log(torch.tensor([1.0 / navigation.NUM_ACTIONS]))
    loss = navigation.ppo_loss((logits, value), (torch.tensor([0]), logp, torch.tensor([2.0]), torch.tensor([3.0])))
    entropy = math.log(navigation.NUM_ACTIONS)
    assert loss.item() == pytest.approx(-2.0 + navigation.VALUE_COEF * 0.5 * 4.0 - navigation.ENTROPY_COEF * entropy)


def test_label_ids_map_to_the_19_train_ids():
    assert cityscapes.TRAIN_ID[[7, 8, 26, 33, 0, 6, 9, 34]].tolist() == [0, 1, 13, 18, 255, 255, 255, 255]
    assert sorted(set(cityscapes.TRAIN_ID.tolist()) - {255}) == list(range(19))


# ---- loaders, one step, evaluation -------------------------------------------------------------------


@pytest.mark.slow  # trains for tens of seconds: not the quick subset's
def test_cityscapes_fixture_loads_trains_and_evaluates(tmp_path):
    task = tasks.get("cityscapes_deeplabv3")
    with pytest.raises(DataRootError, match="--set data_root=DIR"):
        task.check_data(tmp_path)
    root = write_cityscapes(tmp_path)
    train, val = task.make_datasets(root)
    assert len(train) == 4 and len(val) == 2
    x, y = val[0]
    assert x.shape == (3, 32, 64) and y.dtype == torch.long
    assert set(y.unique().tolist()) == {0, 10, 13, 255}  # road, sky, car, unlabeled
    xt, yt = train[0]
    assert xt.shape == (3, 32, 64) and yt.shape == (32, 64)  # crop capped at the image size
    torch.manual_seed(0)
    model = task.make_model()
    batch = next(iter(DataLoader(train, batch_size=2)))
    assert math.isfinite(one_step(task, model, *batch))
    val_loss, miou = task.validate(model, DataLoader(val, batch_size=256), torch.device("cpu"))
    assert math.isfinite(val_loss) and 0.0 <= miou <= 1.0


@pytest.mark.slow  # trains for tens of seconds: not the quick subset's
def test_wmt17_fixture_builds_its_tokenizer_trains_and_evaluates(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    task = tasks.get("wmt17_transformer")
    root = write_wmt17(tmp_path / "data")
    train, test = task.make_datasets(root)
    assert len(train) == 24 and len(test) == 3
    assert list((tmp_path / "cache" / "dp-bench").glob("wmt17-spm-*.model"))
    sp = test.tokenizer
    assert sp.decode(train[0][1][:-1].tolist()) == DE[0] and train[0][1][-1] == wmt17.EOS
    sampler = DistributedSampler(train, num_replicas=2, rank=1, shuffle=True, seed=0, drop_last=True)
    loader = task.train_loader(train, sampler, 4, None, torch.device("cpu"))
    batches = list(loader)
    assert len(batches) == len(loader) == 3
    (src, tgt_in), tgt = batches[0]
    assert src.shape[0] == 4 and tgt_in.shape == tgt.shape and (tgt_in[:, 0] == wmt17.BOS).all()
    torch.manual_seed(0)
    model = task.make_model()
    assert math.isfinite(one_step(task, model, (src, tgt_in), tgt))
    val_loss, bleu = task.validate(model, DataLoader(Subset(test, range(3)), batch_size=256), torch.device("cpu"))
    assert math.isfinite(val_loss) and 0.0 <= bleu <= 100.0


def test_wmt17_names_a_missing_file(tmp_path):
    (tmp_path / wmt17.FOLDER).mkdir()
    (tmp_path / wmt17.FOLDER / "train.en").write_text("x\n")
    with pytest.raises(DataRootError, match="lacks train.de, test.en, test.de"):
        tasks.get("wmt17_transformer").check_data(tmp_path)


@pytest.mark.slow  # trains for tens of seconds: not the quick subset's
def test_navigation_rollouts_train_and_evaluate():
    task = tasks.get("navigation_ddppo")
    train, val = task.make_datasets(None)
    torch.manual_seed(0)
    model = task.make_model()
    sampler = DistributedSampler(train, num_replicas=2, rank=0, shuffle=True, seed=0, drop_last=True)
    loader = task.train_loader(train, sampler, 16, model, torch.device("cpu"))
    assert len(loader) == navigation.ROLLOUTS_PER_EPOCH * navigation.PPO_EPOCHS * navigation.NUM_MINI_BATCH
    (view, goal), y = next(iter(loader))
    assert view.shape == (16, 7, 7, 3) and goal.shape == (16, 3) and len(y) == 4
    assert math.isfinite(one_step(task, model, (view, goal), y))
    loss, score = task.validate(model, DataLoader(Subset(val, range(4)), batch_size=256), torch.device("cpu"))
    assert math.isfinite(loss) and 0.0 <= score <= 1.0


class _MetaPolicy(torch.nn.Module):
    """A uniform policy that checks its input is on ``meta`` (a stand-in for CUDA: devices are checked,
    nothing is computed) and answers on the CPU, where ``evaluate`` samples the action."""

    def forward(self, x: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        view, goal = x
        assert view.device == goal.device == torch.device("meta")
        return torch.zeros(len(view), navigation.NUM_ACTIONS), torch.zeros(len(view))


def test_navigation_evaluation_reduces_its_sums_on_the_evaluation_device(monkeypatch):
    """NCCL reduces device tensors only: the sums ``evaluate`` all-reduces are built on its device.
    The all-reduce is intercepted there (meta tensors hold no values to read back)."""

    class Reduced(Exception):
        pass

    devices = []

    def all_reduce(tensor, *args, **kwargs):
        devices.append(tensor.device)
        raise Reduced

    monkeypatch.setattr(navigation.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(navigation.dist, "all_reduce", all_reduce)
    _, val = navigation.make_datasets()
    loader = [torch.tensor([val[0], val[1]])]  # one batch of two episode seeds (a DataLoader would ask dist)
    with pytest.raises(Reduced):
        navigation.evaluate(_MetaPolicy(), loader, torch.device("meta"))
    assert devices == [torch.device("meta")]


# ---- end to end --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["cityscapes_deeplabv3", "wmt17_transformer", "navigation_ddppo"])
def test_allreduce_run_on_two_processes_completes(tmp_path, task, run_command):
    sets = ["epochs=1", "wandb=false"]
    if task == "cityscapes_deeplabv3":
        sets.append(f"data_root={write_cityscapes(tmp_path / 'data')}")
    elif task == "wmt17_transformer":
        sets += [f"data_root={write_wmt17(tmp_path / 'data')}", "batch_size=6"]
    else:
        sets.append("batch_size=16")
    out = tmp_path / "run"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = ["--algorithm", "allreduce", "--task", task, "--nodes", "1", "--procs-per-node", "2", "--out", str(out)]
    result = subprocess.run(
        [*run_command, *args, *(f"--set={s}" for s in sets)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["epochs"] == 1 and summary["steps"] >= 1
    assert summary["metric"] == tasks.get(task).metric and summary["final_metric"] is not None
