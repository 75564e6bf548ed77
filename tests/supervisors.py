"""A real ``roomkeeper serve`` for tests, over a fake gateway or a given one, always stopped.

The fake gateway is a small ``python -c`` program that speaks the supervisor's
channel and does what its plan says; ``serve`` starts the supervisor with short
timings and backoffs, and SIGKILLs whatever it or its gateways left.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from roomkeeper.supervisor.records import read_events
from tests.gateways import free_port, gateway_env, stop_process

# Watchdog timings short enough for a test to see every stage in seconds.
FAST = {
    "ROOMKEEPER_WATCHDOG_START": "3",
    "ROOMKEEPER_WATCHDOG_HEARTBEAT": "1",
    "ROOMKEEPER_WATCHDOG_RELIEF": "1",
    "ROOMKEEPER_WATCHDOG_SHUTDOWN": "1",
}


# A gateway stand-in that speaks the channel.  FAKE_PLAN lists one behaviour per
# launch (the last one repeats); it keeps what it hears in FAKE_DIR/heard-<n> and
# the pid of its "managed tree" (hang, stubborn) in FAKE_DIR/tree-<n>.
FAKE_GATEWAY = r"""
import json, os, signal, socket, sys, threading, time, uuid
d = os.environ["FAKE_DIR"]
counter = os.path.join(d, "launches")
n = len(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "a").write("x")
plan = os.environ["FAKE_PLAN"].split(",")
mode = plan[min(n, len(plan) - 1)]
sock = socket.socket(fileno=int(os.environ["ROOMKEEPER_IPC_FD"]))
boot = uuid.uuid4().hex
lock = threading.Lock()
def send(kind, **fields):
    with lock:
        sock.sendall((json.dumps({"type": kind, **fields}) + "\n").encode())
def listen():
    buf = b""
    with open(os.path.join(d, "heard-%d" % n), "a") as out:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                os._exit(0)  # supervisor gone: shut down
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                out.write(line.decode() + "\n"); out.flush()
                m = json.loads(line)
                if mode == "repair" and m["type"] == "recovery_mode" and m["on"]:
                    send("repaired")
if mode == "crash":
    sys.exit(3)
caps = ["relief", "recovery_mode"]
if mode != "nobeat":
    caps += ["heartbeat", "restart"]
protocol = int(os.environ.get("FAKE_PROTOCOL", "1"))
send("hello", protocol=protocol, capabilities=caps, boot_id=boot, pid=os.getpid())
threading.Thread(target=listen, daemon=True).start()
if mode in ("hang", "stubborn"):  # ignores SIGTERM; has a managed tree in its own session
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    import subprocess
    tree = subprocess.Popen(["sleep", "60"], start_new_session=True)
    open(os.path.join(d, "tree-%d" % n), "w").write(str(tree.pid))
if mode == "hang":
    for _ in range(5):
        send("heartbeat", boot_id=boot, at=time.time()); time.sleep(0.2)
    while True:
        time.sleep(60)
send("heartbeat", boot_id=boot, at=time.time())
if mode in ("restart", "stop"):
    time.sleep(0.1)
    send(mode)
    sys.exit(0)
while True:
    if mode != "nobeat":
        send("heartbeat", boot_id=boot, at=time.time())
    time.sleep(0.2)
"""


@dataclass
class Served:
    """A real ``roomkeeper serve`` started by a test."""

    proc: subprocess.Popen[bytes]
    home: Path
    port: int
    log: Path
    env: dict[str, str]
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    def events(self) -> list[dict[str, Any]]:
        """The supervisor's recorded events so far."""
        return read_events(self.home)

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 20
    ) -> list[dict[str, Any]]:
        """Poll the events until ``predicate`` holds; remember every gateway pid seen."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.events()
            for e in events:
                if e["event"] == "launched" and e["pid"] not in self.seen:
                    with contextlib.suppress(psutil.Error):
                        self.seen[e["pid"]] = psutil.Process(e["pid"])
            if predicate(events):
                return events
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out; events: {[e['event'] for e in events]}\n{self.log.read_text()}"
                )
            time.sleep(0.05)

    def wait_event(self, name: str, count: int = 1, timeout: float = 20) -> list[dict[str, Any]]:
        """Wait until ``name`` was recorded ``count`` times."""
        return self.wait_for(lambda ev: names(ev).count(name) >= count, timeout)

    def wait_healthy_gen(self, gen: int | None = None, timeout: float = 20) -> list[dict[str, Any]]:
        """Wait until a gateway (of generation ``gen``, if given) reported healthy or recovered."""
        return self.wait_for(lambda ev: bool(healthy_events(ev, gen)), timeout)

    def gateway_tree(self) -> list[psutil.Process]:
        """The supervisor's descendants now."""
        with contextlib.suppress(psutil.Error):
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        return []


def names(events: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in events]


def first(events: list[dict[str, Any]], name: str, **match: Any) -> dict[str, Any]:
    return next(
        e for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())
    )


# A gateway whose first heartbeat came after the start grace (a busy machine) was
# relieved and then said "recovered", never "healthy": both mean it answers now.
HEALTHY_NOW = ("healthy", "recovered")


def healthy_events(events: list[dict[str, Any]], gen: int | None = None) -> list[dict[str, Any]]:
    """The events saying a gateway (of generation ``gen``, if given) answers its probe."""
    return [e for e in events if e["event"] in HEALTHY_NOW and gen in (None, e["gen"])]


def first_after(
    events: list[dict[str, Any]], name: str, since: float, **match: Any
) -> dict[str, Any]:
    """The first ``name`` event recorded at or after the monotonic time ``since``."""
    return first([e for e in events if e["mono"] >= since], name, **match)


def kill_ours(procs: list[psutil.Process]) -> None:
    """SIGKILL processes we started (psutil checks the pid still names the same process)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=5)


@contextlib.contextmanager
def serve(
    tmp: Path,
    *,
    fake_plan: str | None = None,
    gateway: list[str] | None = None,
    prefix: list[str] | None = None,
    backoff_s: float = 0.2,
    backoff_max_s: float = 2.0,
    **extra: str,
) -> Iterator[Served]:
    """Start what ``roomkeeper serve`` runs, with short backoffs (over the fake gateway when
    ``fake_plan`` is given, over ``gateway`` when that is); whatever happens, stop it and
    SIGKILL every process it or its gateways left, by pid."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    env = gateway_env(tmp, **{**FAST, **extra})
    if fake_plan is not None:
        env.update(FAKE_DIR=str(tmp), FAKE_PLAN=fake_plan)
        gateway = [sys.executable, "-c", FAKE_GATEWAY]
    log = tmp / "serve.log"
    code = (
        "from roomkeeper.testing import serve_for_tests; raise SystemExit(serve_for_tests("
        f"{port}, gateway_command={gateway!r},"
        f" backoff_s={backoff_s!r}, backoff_max_s={backoff_max_s!r}))"
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*(prefix or []), sys.executable, "-c", code],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    served = Served(proc, Path(env["ROOMKEEPER_HOME"]), port, log, env)
    try:
        yield served
    finally:
        with contextlib.suppress(AssertionError):
            served.wait_for(lambda ev: True, timeout=0)
        left = served.gateway_tree()
        stop_process(proc)
        kill_ours([*left, *served.seen.values()])
