"""A rank's threads and their locks on the virtual clock, and ``torch.distributed``'s state per thread.

The thread-local ``torch.distributed`` state (each thread its own default group and group map)
follows the way PyTorch's own multi-threaded test process group does it
(``torch/testing/_internal/distributed/multi_threaded_pg.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from torch.distributed import distributed_c10d as c10d

from benchmarks.virtual.scheduler import Scheduler


class Threads:
    """What ``algorithms.comm.threads()`` gives on the virtual cluster: ``threading``'s Thread, Lock,
    Event and Condition, whose waits are waits on the virtual clock. Only one thread runs at a time,
    so a wait that ``threading`` would spend blocked hands the machine to the next thread in time
    order; what it waits for (a release, a set, a notify) happens at the virtual time of its maker."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def Thread(self, target: Callable[[], None], name: str = "", daemon: bool = True) -> _Thread:  # noqa: N802
        return _Thread(self.scheduler, target, name)

    def Lock(self) -> _Lock:  # noqa: N802
        return _Lock(self.scheduler)

    def Event(self) -> _Event:  # noqa: N802
        return _Event(self.scheduler)

    def Condition(self) -> _Condition:  # noqa: N802
        return _Condition(self.scheduler)


class _Thread:
    def __init__(self, scheduler: Scheduler, target: Callable[[], None], name: str) -> None:
        self.scheduler, self.target, self.name, self.actor = scheduler, target, name, None

    def start(self) -> None:
        self.actor = self.scheduler.spawn(self.target, self.name)

    def join(self, timeout: float | None = None) -> None:  # noqa: ARG002 - a virtual wait has no timeout
        actor = self.actor
        self.scheduler.wait(lambda: actor.clock if actor.done else None, f"thread {self.name} to end", actor)

    def is_alive(self) -> bool:
        return self.actor is not None and not self.actor.done


class _Lock:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.owner, self.released_at = scheduler, None, 0.0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:  # noqa: ARG002
        if self.owner is not None:
            self.scheduler.wait(lambda: self.released_at if self.owner is None else None, "a lock", self)
        self.owner = self.scheduler.me()
        return True

    def release(self) -> None:
        self.owner, self.released_at = None, self.scheduler.now()
        self.scheduler.poke(self)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class _Event:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.flag, self.set_at = scheduler, False, 0.0

    def set(self) -> None:
        if not self.flag:
            self.flag, self.set_at = True, self.scheduler.now()
            self.scheduler.poke(self)

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:  # noqa: ARG002
        if not self.flag:
            self.scheduler.wait(lambda: self.set_at if self.flag else None, "an event", self)
        return True


class _Condition:
    """``threading.Condition``: ``wait`` returns at the first notify after it began (callers loop on
    their predicate, as ``threading`` requires)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler, self.lock = scheduler, _Lock(scheduler)
        self.notifications, self.notified_at = 0, 0.0

    def __enter__(self) -> bool:
        return self.lock.acquire()

    def __exit__(self, *exc) -> None:
        self.lock.release()

    def wait(self, timeout: float | None = None) -> bool:  # noqa: ARG002 - woken by a notify only
        seen = self.notifications
        self.lock.release()
        self.scheduler.wait(lambda: self.notified_at if self.notifications > seen else None, "a condition", self)
        self.lock.acquire()
        return True

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:  # noqa: ARG002
        while not predicate():
            self.wait()
        return True

    def notify_all(self) -> None:
        self.notifications += 1
        self.notified_at = self.scheduler.now()
        self.scheduler.poke(self)

    notify = notify_all  # a spurious wake-up is allowed


# -- one torch.distributed world per thread -----------------------------------------------------


class ThreadWorlds(c10d._World):
    """``torch.distributed``'s global group state, one per thread (each thread is a rank)."""

    local = threading.local()

    def _data(self) -> dict:
        data = getattr(self.local, "data", None)
        if data is None:
            data = self.local.data = dict(
                default_pg=None,
                pg_map={},
                pg_names={},
                pg_group_ranks={},
                pg_backend_config={},
                group_count=0,
                tags_to_pg={},
                pg_to_tag={},
                pg_coalesce_state={},
                comms=[],
            )
        return data

    def __init__(self) -> None:
        """Nothing per process: ``_World.__init__`` would set the per-process attributes that the
        properties below replace with each thread's own."""


def _property(name: str, settable: bool = False) -> property:
    def get(self):
        return self._data()[name]

    def put(self, value):
        self._data()[name] = value

    return property(get, put if settable else None)


for _name in ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "tags_to_pg", "pg_to_tag"):
    setattr(ThreadWorlds, _name, _property(_name))
for _name in ("pg_coalesce_state", "comms"):
    setattr(ThreadWorlds, _name, _property(_name))
for _name in ("default_pg", "group_count"):
    setattr(ThreadWorlds, _name, _property(_name, settable=True))
