"""The run directory: config.json, env.json, metrics.csv, summary.json (see results/README.md).

Only rank 0 writes. ``summary.json`` is written last, through a temporary file and ``os.replace``,
so a reader sees either no summary (the run is unfinished) or a whole one, never a torn file.
"""

from __future__ import annotations

import csv
import fcntl
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

import torch

from benchmarks import checkpoint, naming, tasks
from benchmarks.config import ConfigError

METRIC_COLUMNS = list(naming.METRIC_COLUMNS)
MEASUREMENTS = naming.MEASUREMENTS


def write_json_atomic(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def summary(
    cfg, status: str, error: str | None = None, clock: str = "wall", task: tasks.Task | None = None, **fields: object
) -> dict[str, object]:
    """summary.json: the run's identity, its status, its measurements (``None`` where it has none yet).
    ``task``: the run's task where the caller has it (else looked up by ``cfg.task``)."""
    task = task or tasks.get(cfg.task)
    identity = {k: v for k, v in cfg.to_json().items() if k not in ("hparams", "algorithm_params", "settings")}
    unknown = set(fields) - set(MEASUREMENTS)
    if unknown:
        raise TypeError(f"summary() got fields that summary.json does not have: {sorted(unknown)}")
    return {
        "status": status,
        **identity,
        **dict.fromkeys(MEASUREMENTS),
        **{"epochs": 0, "steps": 0, "samples": 0},  # a run that never trained did none
        **fields,
        "metric": task.metric,
        "target": task.target,
        "clock": clock,
        "error": error,
    }


def write_summary(cfg, status: str, **fields: object) -> dict[str, object]:
    """Write ``cfg.out``/summary.json (``summary``'s fields) atomically; return what was written."""
    payload = summary(cfg, status, **fields)
    put_summary(cfg.out, payload)
    return payload


# A summary with one of these statuses is a finished run: the workflow keeps it as it is. A ``timeout``
# summary is a run stopped at a time limit with a checkpoint, which the same command resumes.
FINISHED = ("completed", "diverged", "failed")
# The finished run's own copy of its summary. summary.json is also the workflow's output, which
# Snakemake deletes before it runs a job again: a restarted controller that finds a run marked
# incomplete (its first controller was killed while the run went on) reruns it, and may do so after
# the run has finished. The copy survives, and ``take`` puts summary.json back from it.
FINISHED_COPY = "finished.json"


def put_summary(out: Path, payload: dict[str, object]) -> None:
    """Write ``payload`` as ``out``/summary.json, and as its finished copy once the run has finished."""
    if payload.get("status") in FINISHED:
        write_json_atomic(Path(out) / FINISHED_COPY, payload)
    write_json_atomic(Path(out) / naming.SUMMARY, payload)


def read_summary(out: Path) -> dict[str, object] | None:
    path = Path(out) / naming.SUMMARY
    return json.loads(path.read_text()) if path.exists() else None


def hold(out: Path) -> IO[str]:
    """Take run directory ``out``'s lock (``run.lock``) for as long as the returned file stays open:
    a second start of the same run (a workflow restarted while its first controller's run still
    goes on, a Slurm job submitted twice) waits for the first to end instead of training a second
    copy into the same folder. The OS drops the lock when its process ends, killed or not."""
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / "run.lock", "a+")  # noqa: SIM115 - held open for the run's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        print(f"{out}: waiting for the run already in progress there ({holder})", file=sys.stderr, flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def keep_earlier_log(out: Path) -> Path | None:
    """A run that starts again from nothing (no summary, no checkpoint) starts with a log of its own:
    an earlier attempt's ``log.txt`` is kept beside it as ``log.N.txt``, the first free N. Returns
    where it went."""
    log = Path(out) / "log.txt"
    if not log.exists() or read_summary(out) is not None or checkpoint.latest(out) is not None:
        return None
    n = 1
    while (kept := log.with_name(f"log.{n}.txt")).exists():
        n += 1
    log.rename(kept)
    return kept


_HELD: list[IO[str]] = []  # the run folder's lock, held by this process until it ends


def take(out: Path, owner: bool, keep_finished: bool = False) -> bool:
    """Start run ``out``; True when it is finished and ``keep_finished`` keeps it as it is (the
    workflow's ``--keep-finished``: a restarted workflow never trains a run twice). The process that
    owns the run (not the ranks a local launch spawns, nor ranks 1.. of srun's) holds its lock
    (``hold``) for its life, so that a second start waits for this one; a finished run whose
    summary.json the workflow removed gets it back from its copy (``FINISHED_COPY``); a finished run is otherwise
    refused (``refuse_finished``); an attempt that left no checkpoint gets a log of its own
    (``keep_earlier_log``)."""
    if owner:
        _HELD.append(hold(out))
    copy = Path(out) / FINISHED_COPY
    if keep_finished and read_summary(out) is None and copy.is_file():
        write_json_atomic(Path(out) / naming.SUMMARY, json.loads(copy.read_text()))
        print(f"{out}: finished, its summary.json removed since (a restarted workflow); put back from {copy.name}")
    status = (read_summary(out) or {}).get("status")
    if keep_finished and status in FINISHED:
        print(f"{out}: already finished ({status}); kept as it is")
        return True
    refuse_finished(out)
    if owner and (kept := keep_earlier_log(out)):
        print(f"{out}: an earlier attempt left no checkpoint; starting again, its log kept as {kept.name}")
    return False


def refuse_finished(out: Path) -> None:
    """Refuse a finished run's directory; a run stopped at a time limit (``timeout``) is resumed."""
    summary = read_summary(out)
    if summary is not None and summary.get("status") != "timeout":
        hint = " (or delete its summary.json to resume from its checkpoint)" if checkpoint.latest(out) else ""
        raise ConfigError(
            f"{out} already holds a finished run (status {summary.get('status')}); "
            f"pass another --out or delete that folder{hint}"
        )


def git_commit() -> dict[str, object]:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    return {"git_commit": commit or None, "git_dirty": dirty if commit else None}


# The libraries the suite uses (pyproject.toml, envs/), by distribution name, with the module each is
# imported as. env.json records each one's installed version whether or not the run imported it: a
# run that never imports wandb or horovod still ran with the ones installed, and two runs' software
# differs in them all the same.
LIBRARIES = {
    "torch": "torch",
    "torchvision": "torchvision",
    "numpy": "numpy",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "scikit-learn": "sklearn",
    "scipy": "scipy",
    "pillow": "PIL",
    "mnist1d": "mnist1d",
    "sacrebleu": "sacrebleu",
    "sentencepiece": "sentencepiece",
    "gymnasium": "gymnasium",
    "minigrid": "minigrid",
    "pyyaml": "yaml",
    "tqdm": "tqdm",
    "jinja2": "jinja2",
    "wandb": "wandb",
    "snakemake": "snakemake",
    "snakemake-executor-plugin-slurm": "snakemake_executor_plugin_slurm",
    "mpi4py": "mpi4py",
    "mpich": "mpich",
    "horovod": "horovod",
}


def library_versions() -> dict[str, str | None]:
    """Each of ``LIBRARIES``' installed version, ``None`` where it is not installed: one metadata
    lookup each, not a walk over every installed distribution. A module imported from where no
    metadata describes it (a site's PyTorch module on ``PYTHONPATH``) is installed all the same: its
    ``__version__`` stands in."""
    versions: dict[str, str | None] = {}
    for name, module in LIBRARIES.items():
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = getattr(sys.modules.get(module), "__version__", None)
    return versions


def environment(
    backend: str, launcher: str, hosts: list[str], device: torch.device, slurm_job_id: str | None, threads: int
) -> dict[str, object]:
    """What env.json records: enough to tell two runs' machines and software apart."""
    versions = {"python": platform.python_version(), **library_versions()}
    if device.type == "cuda":
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        devices = [platform.processor() or platform.machine()]
    return {
        **versions,
        **git_commit(),
        "platform": platform.platform(),
        "hosts": sorted(set(hosts)),
        "hosts_by_rank": hosts,
        "backend": backend,
        "launcher": launcher,
        "slurm_job_id": slurm_job_id,
        "device": device.type,
        "devices": devices,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "cpu_count": os.cpu_count(),
        "threads_per_process": threads,
    }


class MetricsWriter:
    """Appends one row per evaluation to metrics.csv, flushed at once so a crash loses nothing.

    Args:
        path: the metrics.csv to write.
        extra_columns: the algorithm's own columns, after the common ones.
        resume_at: for a resumed run, the file's length in bytes when its checkpoint was taken: the
            rows up to there are kept and new rows are appended. A row written after that checkpoint
            (the run died between its evaluation and its next checkpoint) is cut off, since the resumed
            run evaluates that epoch again. ``None`` starts a new file.
    """

    def __init__(self, path: Path, extra_columns: list[str], resume_at: int | None = None) -> None:
        self.columns = METRIC_COLUMNS + [c for c in extra_columns if c not in METRIC_COLUMNS]
        if resume_at is not None and path.exists() and path.stat().st_size >= resume_at:
            os.truncate(path, resume_at)
            self.file = open(path, "a", newline="")  # noqa: SIM115 - open for the whole run, closed by close()
            self.writer = csv.DictWriter(self.file, fieldnames=self.columns, extrasaction="ignore")
            return
        if resume_at is not None:
            raise FileNotFoundError(
                f"{path} is missing or shorter than its checkpoint recorded ({resume_at} "
                "bytes); delete the run's checkpoint/ folder to start it afresh"
            )
        self.file = open(path, "w", newline="")  # noqa: SIM115 - open for the whole run, closed by close()
        self.writer = csv.DictWriter(self.file, fieldnames=self.columns, extrasaction="ignore")
        self.writer.writeheader()
        self.file.flush()

    def tell(self) -> int:
        """Bytes written so far (what a checkpoint records to resume at)."""
        return self.file.tell()

    def write(self, row: dict[str, object]) -> None:
        self.writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in self.columns})
        self.file.flush()

    def close(self) -> None:
        self.file.close()
