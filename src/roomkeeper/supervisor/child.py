"""The gateway as the supervisor's child: its command line, its start, its record, its tree.

The gateway is the supervisor's child, ``python -m roomkeeper gateway --port
P`` (a command line that names it, not a bare fork), started in its own
session with one end of a socketpair (:mod:`roomkeeper.ipc`,
ROOMKEEPER_IPC_FD).  Its own session keeps it out of the supervisor's way:
Ctrl-C on a terminal reaches only the supervisor, which stops the gateway in
order.  If the supervisor dies, even by SIGKILL, the gateway reads
end-of-file on the channel and runs its shutdown path.

When and why it is started, stopped or killed is :mod:`roomkeeper.supervisor.service`'s.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psutil

from roomkeeper.ipc import ENV_FD, RECOVERY_MODE_VARIABLE, Channel, pair
from roomkeeper.supervisor.restarts import RestartReason
from roomkeeper.supervisor.sdnotify import NOTIFY_VARIABLES
from roomkeeper.supervisor.watchdog import Watchdog


def gateway_command(port: int, socket_path: str | None) -> list[str]:
    """The child's command: ``python -m roomkeeper gateway --port P`` (or ``--socket S``)."""
    where = ["--socket", socket_path] if socket_path else ["--port", str(port)]
    return [sys.executable, "-m", "roomkeeper", "gateway", *where]


def start_gateway(
    command: Sequence[str],
    env: Mapping[str, str],
    reason: RestartReason,
    *,
    recovery_mode: bool,
) -> tuple[subprocess.Popen[bytes], Channel]:
    """Start ``command`` in its own session with one end of a new channel; it and our end.

    Args:
        command: the gateway's command line.
        env: the supervisor's variables, the base of the child's environment.
        reason: why this launch happens (ROOMKEEPER_RESTART_REASON).
        recovery_mode: whether the child starts in recovery mode.

    Raises:
        OSError: the command could not be started (our end is closed then).
    """
    ours, theirs = pair()
    child_env = {k: v for k, v in env.items() if k not in NOTIFY_VARIABLES}
    child_env.pop("ROOMKEEPER_SUPERVISE", None)  # the child has a channel: it never adopts
    child_env.update(
        {
            ENV_FD: str(theirs.fileno()),
            "ROOMKEEPER_SUPERVISED": "1",
            "ROOMKEEPER_RESTART_REASON": reason.value,
            # Latched before the child starts anything: its hello would come too late.
            RECOVERY_MODE_VARIABLE: "1" if recovery_mode else "0",
        }
    )
    try:
        proc = subprocess.Popen(
            command,
            env=child_env,
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # terminal signals reach only the supervisor
        )
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()
    return proc, ours


@dataclass
class Child:
    """One launch of the gateway, and what the supervisor has heard from it."""

    gen: int
    proc: subprocess.Popen[bytes]
    channel: Channel
    watchdog: Watchdog
    root: psutil.Process | None
    boot_id: str | None = None
    capabilities: frozenset[str] = frozenset()
    stop_said: bool = False
    restart_said: bool = False
    exit_code: int | None = None
    exited_at: float | None = None  # when its exit was seen: its last messages may follow
    eof: bool = False


def kill_tree(root: psutil.Process) -> int:
    """SIGKILL ``root`` and all its descendants, collected by pid first; how many were signalled.

    The tree is frozen (SIGSTOP) before it is killed and collected once more,
    so a process forked while we looked is not missed.  ``root`` carries its
    start time, so a reused pid is never signalled.
    """
    procs: dict[int, psutil.Process] = {}

    def collect(proc: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            for p in [proc, *proc.children(recursive=True)]:
                procs.setdefault(p.pid, p)

    collect(root)
    for p in list(procs.values()):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)
    for p in list(procs.values()):
        collect(p)
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    return len(procs)
