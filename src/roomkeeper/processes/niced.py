"""Starting a process at a lower CPU priority without an extra ``nice`` exec.

On Linux the nice value belongs to a thread, and a child is born with the
nice value of the thread that forked it.  So a job that must run at nice N
is started from a thread of ours that runs at N itself: one long-lived
thread per nice value, set once when it starts (lowering a thread's
priority needs no privilege; raising it back would, and is never done).
The scheduler's own threads keep their priority, and the job's command is
the first thing that runs, with no ``nice`` program exec'd before it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["run_at_nice", "thread_nice"]

T = TypeVar("T")


class _Spawners:
    """The process's spawner threads, one per nice value, made when first asked for."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_nice: dict[int, ThreadPoolExecutor] = {}

    def forget(self) -> None:
        """A forked child has none of its parent's threads, and the lock may have been held
        by one of them: it starts afresh and makes its own spawners when it needs them."""
        self.lock = threading.Lock()
        self.by_nice = {}


_spawners = _Spawners()


def thread_nice() -> int:
    """The calling thread's own nice value (Linux keeps one per thread)."""
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def run_at_nice(nice: int, start: Callable[[], T]) -> T:
    """``start()`` run from a thread at ``nice``, so that what it forks is born there.

    Where the calling thread already runs at ``nice`` or lower priority, ``start`` runs
    here; a process is never started at a higher priority than the thread asking.
    Whatever ``start`` raises is raised here.

    Raises:
        OSError: no thread could be set to ``nice`` (nothing was started).
    """
    if nice <= thread_nice():
        return start()
    try:
        return _spawner(nice).submit(start).result()
    except BrokenExecutor as err:
        raise OSError(errno.EPERM, f"no thread of ours could be set to nice {nice}") from err


def _spawner(nice: int) -> ThreadPoolExecutor:
    with _spawners.lock:
        spawner = _spawners.by_nice.get(nice)
        if spawner is None:
            spawner = _spawners.by_nice[nice] = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix=f"roomkeeper-spawn-nice{nice}",
                initializer=_lower_own_priority,
                initargs=(nice,),
            )
        return spawner


def _lower_own_priority(nice: int) -> None:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


os.register_at_fork(after_in_child=_spawners.forget)
