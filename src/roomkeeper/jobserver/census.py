"""Who in a job's tree holds tokens: its jobserver clients, their steps, and what those hold.

A *client* is a process with the job's FIFO open (make, ninja, cargo, rustc,
a sub-make; a recipe make did not mark recursive never inherits it).  A
*step* is a live child of a client.  Each client runs one step on its
implicit slot and one more per token, so the tokens a job's clients can
hold now are, per client, its live children less one; a client's threads
beyond two count as steps too, because rustc runs codegen threads on
tokens.  More tokens out than that for a while means a client died holding
them (its children, orphaned, are no longer its).  Counting threads only
ever allows more, so a client's threads can hide a lost token, never invent
one.

A child with a client somewhere below it (a recipe's shell running a
recursive make, a compiler driver running an LTO link on tokens) is not a
step: the client's own children are.  Counted as one, it would hold its
inner steps' memory twice, and pausing it would stop a client with every
step under it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from roomkeeper.kernel.host import PROC_ROOT

_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class ProcInfo:
    """What the census needs of one process: its parent, threads and anonymous memory."""

    pid: int
    ppid: int
    zombie: bool
    threads: int
    anon_bytes: int


@dataclass(frozen=True, slots=True)
class Census:
    """One look at a job's tree.

    Attributes:
        clients: the processes that have the FIFO open.
        steps: each live step's pid and its subtree's anonymous memory.
        may_hold: the tokens the clients' steps account for.
    """

    clients: frozenset[int]
    steps: dict[int, int]
    may_hold: int


def parse_stat(text: str) -> tuple[int, str, int]:
    """(ppid, state, threads) from ``/proc/<pid>/stat``'s text (comm may hold spaces)."""
    fields = text.rpartition(")")[2].split()
    return int(fields[1]), fields[0], int(fields[17])


def parse_statm(text: str) -> int:
    """Anonymous resident bytes from ``/proc/<pid>/statm``: resident less shared pages."""
    fields = text.split()
    return max(0, int(fields[1]) - int(fields[2])) * _PAGE


def read_proc(pid: int, proc_root: str = PROC_ROOT) -> ProcInfo | None:
    """One process, None once it is gone."""
    try:
        with open(f"{proc_root}/{pid}/stat") as f:
            ppid, state, threads = parse_stat(f.read())
        with open(f"{proc_root}/{pid}/statm") as f:
            anon = parse_statm(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return ProcInfo(pid, ppid, state in ("Z", "X"), threads, anon)


def holds_fifo(pid: int, fifo: str, proc_root: str = PROC_ROOT) -> bool:
    """Whether ``pid`` has ``fifo`` open (any descriptor links to its path)."""
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"{fd_dir}/{name}") == fifo:
                return True
        except OSError:
            continue
    return False


def take_census(pids: Iterable[int], fifo: str, proc_root: str = PROC_ROOT) -> Census:
    """Clients, steps and the tokens they account for, among ``pids`` (the job's tree)."""
    table = {p: info for p in set(pids) if (info := read_proc(p, proc_root)) and not info.zombie}
    clients = frozenset(p for p in table if holds_fifo(p, fifo, proc_root))
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    may_hold = 0
    steps: dict[int, int] = {}
    for client in clients:
        kids = children.get(client, [])
        may_hold += max(0, len(kids) - 1) + max(0, table[client].threads - 2)
        for kid in kids:
            if not _reaches(kid, clients, children):
                steps[kid] = _subtree_anon(kid, table, children)
    return Census(clients, steps, may_hold)


def _reaches(root: int, clients: frozenset[int], children: dict[int, list[int]]) -> bool:
    """Whether ``root`` or any process under it is a client."""
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in clients:
            return True
        stack.extend(children.get(pid, []))
    return False


def _subtree_anon(root: int, table: dict[int, ProcInfo], children: dict[int, list[int]]) -> int:
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += table[pid].anon_bytes
        stack.extend(children.get(pid, []))
    return total
