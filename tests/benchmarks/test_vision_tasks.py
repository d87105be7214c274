"""The CIFAR and ImageNet workloads read fixtures written in the real on-disk formats.

CIFAR's python version is a set of Python 2 cPickle files (protocol 2, every string a Python 2 ``str``,
numpy arrays under ``numpy.core.multiarray``): ``pickle.load(f, encoding="bytes")`` gives keys such
as ``b"data"`` (uint8, N x 3072, the 1024 red, then green, then blue pixels of each row-major image)
and ``b"labels"`` (``b"fine_labels"`` for CIFAR-100); torchvision reads them with ``latin1``. ImageNet
is the ImageFolder layout of JPEG files. No test trains; the whole file runs in a few seconds.
"""

from __future__ import annotations

import io
import pickle
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks import tasks
from benchmarks.tasks import DataRootError, models

CIFAR_TASKS = [name for name in tasks.names() if name.startswith("cifar")]
VISION_TASKS = [*CIFAR_TASKS, "imagenet_resnet50"]
CIFAR10_TRAIN_PER_BATCH, CIFAR10_TEST = 4, 6
CIFAR100_TRAIN, CIFAR100_TEST = 12, 5
WNIDS = ["n01440764", "n01443537", "n01484850"]
_RECONSTRUCT = np.empty(0).__reduce__()[0]  # numpy._core.multiarray._reconstruct


class _Py2Pickler(pickle._Pickler):
    """Writes protocol-2 pickles as Python 2's cPickle did: ``str`` and ``bytes`` as BINSTRING."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj: bytes | str) -> None:
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        size = len(raw)
        if size < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([size]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", size) + raw)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str

    def save_global(self, obj: object, name: str | None = None) -> None:
        if obj is _RECONSTRUCT:  # numpy 2 calls its module numpy._core; the files name numpy.core
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def _dump(path: Path, obj: dict) -> None:
    buffer = io.BytesIO()
    _Py2Pickler(buffer, protocol=2).dump(obj)
    path.write_bytes(buffer.getvalue())


def _images(seed: int, count: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(count, 3072), dtype=np.uint8)


def _labels(start: int, count: int, classes: int) -> list[int]:
    return [(start + 7 * i) % classes for i in range(count)]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Two-image batches gain nothing from threads, and on a shared machine they lose a lot.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cifar10_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar10")
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    for batch in range(1, 6):
        n = CIFAR10_TRAIN_PER_BATCH
        _dump(
            folder / f"data_batch_{batch}",
            {
                b"batch_label": f"training batch {batch} of 5".encode(),
                b"labels": _labels(batch, n, 10),
                b"data": _images(batch, n),
                b"filenames": [f"img_{batch}_{i}.png".encode() for i in range(n)],
            },
        )
    _dump(
        folder / "test_batch",
        {
            b"batch_label": b"testing batch 1 of 1",
            b"labels": _labels(0, CIFAR10_TEST, 10),
            b"data": _images(0, CIFAR10_TEST),
            b"filenames": [f"test_{i}.png".encode() for i in range(CIFAR10_TEST)],
        },
    )
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer"]
    names += [b"dog", b"frog", b"horse", b"ship", b"truck"]
    _dump(folder / "batches.meta", {b"num_cases_per_batch": 10000, b"label_names": names, b"num_vis": 3072})
    return root


@pytest.fixture(scope="module")
def cifar100_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cifar100")
    folder = root / "cifar-100-python"
    folder.mkdir()
    for split, count, seed in (("train", CIFAR100_TRAIN, 10), ("test", CIFAR100_TEST, 11)):
        fine = _labels(seed, count, 100)
        _dump(
            folder / split,
            {
                b"filenames": [f"{split}_{i}.png".encode() for i in range(count)],
                b"batch_label": f"{split}ing batch 1 of 1".encode(),
                b"fine_labels": fine,
                b"coarse_labels": [label // 5 for label in fine],
                b"data": _images(seed, count),
            },
        )
    meta = {
        b"fine_label_names": [f"fine_{i}".encode() for i in range(100)],
        b"coarse_label_names": [f"coarse_{i}".encode() for i in range(20)],
    }
    _dump(folder / "meta", meta)
    return root


def _write_jpegs(folder: Path, count: int, seed: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        pixels = rng.integers(0, 256, size=(30 + 5 * i, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{folder.name}_{i}.JPEG", quality=90)


@pytest.fixture(scope="module")
def imagenet_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imagenet")
    for index, wnid in enumerate(WNIDS):
        _write_jpegs(root / "train" / wnid, 2, seed=index)
        _write_jpegs(root / "val" / wnid, 1, seed=100 + index)
    return root


@pytest.fixture(scope="module")
def roots(cifar10_root: Path, cifar100_root: Path, imagenet_root: Path) -> dict[str, Path]:
    return {"cifar10": cifar10_root, "cifar100": cifar100_root, "imagenet": imagenet_root}


def _dataset_of(task_name: str) -> str:
    return task_name.split("_")[0]


def _num_classes(task_name: str) -> int:
    return {"cifar10": 10, "cifar100": 100, "imagenet": 1000}[_dataset_of(task_name)]


def test_fixture_pickles_have_the_real_keys(cifar10_root: Path, cifar100_root: Path) -> None:
    with open(cifar10_root / "cifar-10-batches-py" / "data_batch_1", "rb") as file:
        batch = pickle.load(file, encoding="bytes")
    assert {b"data", b"labels", b"batch_label", b"filenames"} == set(batch)
    assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape == (CIFAR10_TRAIN_PER_BATCH, 3072)
    with open(cifar100_root / "cifar-100-python" / "train", "rb") as file:
        assert b"fine_labels" in pickle.load(file, encoding="bytes")


@pytest.mark.parametrize("name", CIFAR_TASKS)
def test_cifar_tasks_read_the_pickles(name: str, roots: dict[str, Path]) -> None:
    task = tasks.get(name)
    assert task.name == name and "\n" not in task.description and not task.embedded
    classes = _num_classes(name)
    train, val = task.make_datasets(roots[_dataset_of(name)])
    if classes == 10:
        assert (len(train), len(val)) == (5 * CIFAR10_TRAIN_PER_BATCH, CIFAR10_TEST)
        test_labels, test_images = _labels(0, CIFAR10_TEST, 10), _images(0, CIFAR10_TEST)
    else:
        assert (len(train), len(val)) == (CIFAR100_TRAIN, CIFAR100_TEST)
        test_labels, test_images = _labels(11, CIFAR100_TEST, 100), _images(11, CIFAR100_TEST)
    assert len(train.classes) == classes
    image, label = val[-1]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label == test_labels[-1]
    # Validation images are only normalised: undo it and compare with the stored planar RGB bytes.
    normalize = val.transform.transforms[-1]
    mean, std = (torch.tensor(values).view(3, 1, 1) for values in (normalize.mean, normalize.std))
    expected = torch.from_numpy(test_images[-1].reshape(3, 32, 32)).float() / 255
    torch.testing.assert_close(image * std + mean, expected, atol=1e-5, rtol=0)
    augmented, train_label = train[0]
    assert augmented.shape == (3, 32, 32) and 0 <= train_label < classes
    assert len(pickle.loads(pickle.dumps(train))) == len(train)  # DataLoader workers may be spawned


def test_imagenet_task_reads_the_image_folders(imagenet_root: Path) -> None:
    train, val = tasks.get("imagenet_resnet50").make_datasets(imagenet_root)
    assert (len(train), len(val)) == (2 * len(WNIDS), len(WNIDS))
    assert train.classes == val.classes == WNIDS
    image, label = train[2]
    assert image.shape == (3, 224, 224) and label == 1
    image, label = val[2]
    assert image.shape == (3, 224, 224) and label == 2


@pytest.mark.parametrize("name", VISION_TASKS)
def test_check_data_passes_on_the_fixtures(name: str, roots: dict[str, Path]) -> None:
    tasks.get(name).check_data(roots[_dataset_of(name)])


@pytest.mark.parametrize("name", VISION_TASKS)
def test_missing_data_root_names_the_setting(name: str, tmp_path: Path) -> None:
    task = tasks.get(name)
    for root in (None, tmp_path / "nowhere", tmp_path):
        with pytest.raises(DataRootError, match="--set data_root"):
            task.check_data(root)
        with pytest.raises(DataRootError, match="--set data_root"):
            task.make_datasets(root)


def test_cifar_missing_file_is_named(cifar10_root: Path, tmp_path: Path) -> None:
    shutil.copytree(cifar10_root / "cifar-10-batches-py", tmp_path / "cifar-10-batches-py")
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataRootError, match=r"data_batch_3.*--set data_root"):
        tasks.get("cifar10_resnet20").make_datasets(tmp_path)


def test_imagenet_class_mismatch_is_rejected(tmp_path: Path) -> None:
    _write_jpegs(tmp_path / "train" / WNIDS[0], 1, seed=0)
    _write_jpegs(tmp_path / "train" / WNIDS[1], 1, seed=1)
    _write_jpegs(tmp_path / "val" / WNIDS[0], 1, seed=2)
    _write_jpegs(tmp_path / "val" / WNIDS[2], 1, seed=3)
    task = tasks.get("imagenet_resnet50")
    with pytest.raises(DataRootError, match=WNIDS[1]):
        task.check_data(tmp_path)
    with pytest.raises(DataRootError, match="differ"):
        task.make_datasets(tmp_path)


def test_imagenet_unsorted_val_is_rejected(tmp_path: Path) -> None:
    _write_jpegs(tmp_path / "train" / WNIDS[0], 1, seed=0)
    _write_jpegs(tmp_path / "val", 2, seed=1)  # the flat layout of the official validation archive
    with pytest.raises(DataRootError, match="no class folders"):
        tasks.get("imagenet_resnet50").check_data(tmp_path)


@pytest.mark.parametrize("name", VISION_TASKS)
def test_models_give_one_logit_per_class(name: str) -> None:
    torch.manual_seed(0)
    model = tasks.get(name).make_model()
    size = 224 if name.startswith("imagenet") else 32
    model.train()  # BN in training mode: the first batch a runner would see
    with torch.no_grad():
        logits = model(torch.randn(2, 3, size, size))
    assert logits.shape == (2, _num_classes(name)) and torch.isfinite(logits).all()


def _count(model: torch.nn.Module) -> tuple[int, int]:
    params = list(model.parameters())
    return len(params), sum(p.numel() for p in params)


def test_parameter_counts_match_the_specs() -> None:
    tensors, count = _count(models.resnet20(10))
    assert 260_000 <= count <= 280_000
    # Tensors and parameters of LPP-SGD's model definitions (github.com/bapi/LPP-SGD models/), counted by us.
    assert (tensors, count) == (65, 272_474)
    assert _count(models.resnet20(100)) == (65, 278_324)
    assert _count(models.squeezenet_cifar(10)) == (102, 734_986)
    assert _count(models.squeezenet_cifar(100)) == (102, 781_156)
    assert _count(tasks.get("imagenet_resnet50").make_model()) == (161, 25_557_032)
    # Bias-free standard WRNs: LPP-SGD's conv biases add 4,496 to WRN-16-8's 10,965,866.
    assert _count(models.wide_resnet(16, 8, 10))[1] == 10_965_866 - 4_496
    assert 2_700_000 < _count(models.wide_resnet(16, 4, 10))[1] < 2_800_000


def test_wide_resnet_rejects_bad_depth() -> None:
    with pytest.raises(ValueError, match="``depth``"):
        models.wide_resnet(15, 4, 10)
