"""The supervisor: runs the gateway as its child and watches it from outside.

``roomkeeper serve`` is this small process.  The gateway is its child, with
one end of a socketpair (how it is started and killed:
:mod:`roomkeeper.supervisor.child`).

The watchdog's stages (ROOMKEEPER_WATCHDOG_*, defaults 120/30/20/15 s):
after the start grace, no healthy heartbeat for HEARTBEAT s -> ``relief``;
still none RELIEF s later -> SIGTERM; SHUTDOWN s later -> SIGKILL to the
gateway's whole tree (its descendants collected by pid before the kill);
then a restart, paced by :mod:`roomkeeper.supervisor.restarts`.  Only missing healthy
heartbeats move the stages: resource pressure never does.

Choices made where the protocol allows either:

* A hello with another protocol version (a gateway upgraded in place under
  a running supervisor) is supervised by the capabilities it declares, with
  a ``protocol_differs`` warning; unknown capabilities are ignored.
* A hello without the ``heartbeat`` capability (an older release) gets crash
  supervision only.  A gateway that says *no hello at all* within the start
  grace is taken for a hung start and goes through the stages: every
  release with a ``gateway`` command speaks the channel, and its hello is
  its first message, so silence is not an old release.
* A gateway that said ``stop`` or ``restart`` is on its way out: it gets
  SHUTDOWN s to exit before its tree is killed, and a stop is still a stop.
* An exit with status 0 that nobody asked for counts as a failure.
* A second SIGTERM/SIGINT while stopping kills the gateway's tree at once.
* Under systemd, WATCHDOG=1 goes with every healthy heartbeat and also
  while the supervisor itself keeps time (start grace, backoff, cooldown), so
  systemd's watchdog fires only when the supervisor is stuck or staged
  recovery overruns; READY=1 also comes with a cooldown, so a start never
  hangs on a spent budget.
* As PID 1 (a container's init) the supervisor reaps the orphans handed to it.

Every stage is a log line and a line in the event log (:mod:`roomkeeper.supervisor.records`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import psutil

from roomkeeper.config import (
    RESTART_BACKOFF_MAX_S,
    RESTART_BACKOFF_S,
    WatchdogSettings,
    read_watchdog_settings,
)
from roomkeeper.ipc import EXIT_CANNOT_START, PROTOCOL
from roomkeeper.paths import home_dir
from roomkeeper.supervisor.child import Child, kill_tree, start_gateway
from roomkeeper.supervisor.child import gateway_command as roomkeeper_gateway
from roomkeeper.supervisor.records import EVENT_LOG, EventLog, remove_record, write_record
from roomkeeper.supervisor.restarts import STATE_NAME, Backoff, RestartBudget, RestartReason
from roomkeeper.supervisor.sdnotify import Notifier
from roomkeeper.supervisor.watchdog import Action, Stage, Watchdog

log = logging.getLogger("roomkeeper")

MAX_WAIT_S = 1.0
DRAIN_S = 1.0  # after the gateway exits, how long its last messages may take to arrive


class Supervisor:
    """Launches the gateway, watches its heartbeats, restarts it within the budget.

    Args:
        command: the gateway's command line.
        env: the variables to read, and the base of the child's environment.
        reason: why the first launch happens; by default what the state file says the next
            launch was for (a replaced supervisor's), else START.
        clock: a monotonic clock.
        backoff_s: the wait before the first restart after a failure, doubling from there.
        backoff_max_s: the longest wait between failure restarts.

    Raises:
        ValueError: a backoff that is not a positive number of seconds.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        reason: RestartReason | None = None,
        clock: Callable[[], float] = time.monotonic,
        backoff_s: float = RESTART_BACKOFF_S,
        backoff_max_s: float = RESTART_BACKOFF_MAX_S,
    ) -> None:
        for name, value in (("backoff_s", backoff_s), ("backoff_max_s", backoff_max_s)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds (got {value})")
        self.command = list(command)
        self.backoff_s = backoff_s
        self.exit_code = 0  # the gateway's status when it cannot start at all
        self.backoff_max_s = backoff_max_s
        self.env = dict(os.environ if env is None else env)
        self.home = home_dir(self.env)
        self.clock = clock
        self.budget = RestartBudget(self.home / "recovery" / STATE_NAME)
        self.backoff = Backoff()
        self.record = EventLog(self.home / "recovery" / EVENT_LOG, clock)
        self.notifier = Notifier(self.env)
        # A supervisor that replaces another keeps the reason its launch was for.
        self.reason = reason or self.budget.state.next_reason or RestartReason.START
        self.stopping = False
        self._events: queue.SimpleQueue[tuple[str, int, Any]] = queue.SimpleQueue()
        self._generation = 0
        self._last_ping = -1e18
        self._persistence_reported: str | None = None

    def settings(self) -> WatchdogSettings:
        """The stages and pacing: the variables read now, this supervisor's backoff."""
        return replace(
            read_watchdog_settings(self.env),
            backoff_s=self.backoff_s,
            backoff_max_s=self.backoff_max_s,
        )

    # --------------------------------------------------------------- the loop

    def run(self) -> int:
        """Supervise until an explicit stop; the exit status (0; the gateway's own status
        when it cannot start at all)."""
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        self.record("supervisor_started", pid=os.getpid(), reason=self.reason.value)
        write_record(self.home)
        try:
            reason = self.reason
            left = self.budget.cooldown_left(self.settings().cooldown_s)
            if left > 0:
                self.record("cooldown", f"restart budget spent: no launch for {left:.0f} s", s=left)
                self.notifier.ready(f"cooldown: no launch for {left:.0f} s")
            while not self.stopping and self._pause(left):
                child = self._launch(reason)
                next_step = self._watch(child) if child else (RestartReason.CRASH, None)
                if next_step is None:
                    break
                reason, left = self._next_launch(*next_step)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.notifier.stopping()
            remove_record(self.home)
            self.record("supervisor_stopped", pid=os.getpid())
        return self.exit_code

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._events.put(("signal", 0, signum))  # SimpleQueue.put is safe in a signal handler

    def _next_event(self, until: float) -> tuple[str, int, Any] | None:
        wait = min(MAX_WAIT_S, max(0.0, until - self.clock()))
        try:
            return self._events.get(timeout=wait)
        except queue.Empty:
            return None

    def _ping(self, now: float) -> None:
        """WATCHDOG=1 while the supervisor itself keeps time (grace, backoff, cooldown)."""
        every = self.notifier.watchdog_s
        if every is not None and now - self._last_ping >= every / 2:
            self._last_ping = now
            self.notifier.watchdog()

    def _pause(self, seconds: float) -> bool:
        """Wait before a launch; False when a stop signal came meanwhile (or had come)."""
        until = self.clock() + seconds
        while not self.stopping:
            self._ping(self.clock())
            self._reap_orphans()
            event = self._next_event(until)
            if event is not None and event[0] == "signal":
                self.stopping = True
                self.record("stopping", "stop signal: no restart", signal=event[2])
            elif event is None and self.clock() >= until:
                break  # nothing waiting, and the time is up
        return not self.stopping

    def _reap_orphans(self, keep: int | None = None) -> None:
        """As PID 1 (a container's init), reap the orphans the kernel hands us, never ``keep``."""
        if os.getpid() != 1:
            return
        try:
            children = psutil.Process().children()
        except psutil.Error:
            return  # tried again on the next tick
        for p in children:
            # One child gone between the listing and its status is no reason to leave the
            # others' zombies for a tick more.
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if p.pid != keep and p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)

    # ---------------------------------------------------------------- launch

    def _launch(self, reason: RestartReason) -> Child | None:
        self._generation += 1
        gen = self._generation
        try:
            proc, ours = start_gateway(
                self.command, self.env, reason, recovery_mode=self.budget.recovery_mode
            )
        except OSError as err:
            self.record("launch_failed", f"cannot start the gateway: {err}", gen=gen)
            return None
        self.budget.launched()
        root = None
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(proc.pid)  # keeps its start time: a reused pid is not it
        child = Child(gen, proc, ours, Watchdog(self.settings(), self.clock()), root)
        threading.Thread(target=self._read, args=(child,), daemon=True).start()
        threading.Thread(target=self._wait, args=(child,), daemon=True).start()
        self.record("launched", gen=gen, pid=proc.pid, reason=reason.value)
        log.info("supervisor: gateway launched (pid %d, %s)", proc.pid, reason.value)
        return child

    def _read(self, child: Child) -> None:
        for message in child.channel.messages():
            self._events.put(("message", child.gen, message))
        self._events.put(("eof", child.gen, None))

    def _wait(self, child: Child) -> None:
        self._events.put(("exit", child.gen, child.proc.wait()))

    # ----------------------------------------------------------------- watch

    def _watch(self, child: Child) -> tuple[RestartReason, float] | None:
        """Run one gateway to its end; what to launch next and its healthy time, or None: stop."""
        while True:
            event = self._next_event(self._wake_at(child))
            now = self.clock()
            if event is not None:
                self._handle(child, event, now)
            if child.exit_code is not None and (child.eof or now >= self._drained_by(child)):
                return self._exited(child, child.exit_code, now)
            self._tend(child, now)

    def _drained_by(self, child: Child) -> float:
        """When an exited gateway's last messages have had their time to arrive."""
        # Its last words ("stop" just before exit) may still be on their way.
        return float("inf") if child.exited_at is None else child.exited_at + DRAIN_S

    def _wake_at(self, child: Child) -> float:
        """The latest time to look again: the watchdog's next stage, the drain, MAX_WAIT_S."""
        due = child.watchdog.due()
        return min(self._drained_by(child), self.clock() + MAX_WAIT_S if due is None else due)

    def _handle(self, child: Child, event: tuple[str, int, Any], now: float) -> None:
        """One event: a stop signal, or a word, end of channel or exit of this gateway."""
        kind, gen, value = event
        if kind == "signal":
            self._stop(child, now, value)
        elif gen != child.gen:
            pass  # a late word from an earlier gateway
        elif kind == "message":
            self._message(child, value, now)
        elif kind == "eof":
            child.eof = True
        elif kind == "exit":
            child.exit_code = value
            child.exited_at = now

    def _tend(self, child: Child, now: float) -> None:
        """Between events: reap orphans, move the watchdog's stages, keep systemd's fed."""
        self._reap_orphans(keep=child.proc.pid)
        action = child.watchdog.tick(now) if child.exit_code is None else None
        if action is not None:
            self._act(child, action, now)
        if child.watchdog.stage in (Stage.STARTING, Stage.CRASH_ONLY):
            self._ping(now)

    def _message(self, child: Child, message: dict[str, Any], now: float) -> None:
        """A message from the gateway: hello, heartbeat, stop or restart, repaired."""
        kind = message["type"]
        if kind == "hello":
            self._hello(child, message, now)
        elif kind == "heartbeat":
            self._heartbeat(child, message, now)
        elif kind in ("stop", "restart"):
            self._leaving(child, kind, now)
        elif kind == "repaired":
            self._repaired(child)

    def _hello(self, child: Child, message: dict[str, Any], now: float) -> None:
        """Its first message: who it is and what it can do, which decides how it is watched."""
        child.capabilities = _capabilities(message)
        child.boot_id = str(message.get("boot_id") or "") or None
        child.watchdog.hello(child.capabilities, now)
        protocol = message.get("protocol")
        self.record(
            "hello",
            gen=child.gen,
            boot_id=child.boot_id,
            protocol=protocol,
            heartbeat="heartbeat" in child.capabilities,
        )
        if protocol != PROTOCOL:
            self._protocol_differs(child, protocol)
        if "heartbeat" not in child.capabilities:
            self.record("crash_only", "the gateway sends no heartbeats: crash supervision only")
            self.notifier.ready("gateway running (crash supervision only)")
        if self.budget.recovery_mode:
            child.channel.send("recovery_mode", on=True)
            self.record("recovery_mode_sent", gen=child.gen, on=True)

    def _protocol_differs(self, child: Child, protocol: Any) -> None:
        """Upgraded in place: a newer gateway under this older supervisor (or the reverse)."""
        # Capabilities, not the version, decide what is supervised.
        self.record(
            "protocol_differs",
            f"the gateway speaks channel protocol {protocol!r}, this supervisor"
            f" {PROTOCOL}: supervising by its capabilities; restart `roomkeeper serve`"
            " to run one release",
            gen=child.gen,
            gateway=protocol if isinstance(protocol, int) else None,
            supervisor=PROTOCOL,
        )

    def _heartbeat(self, child: Child, message: dict[str, Any], now: float) -> None:
        """A heartbeat (the gateway's own health probe): healthy again, or still healthy."""
        if child.boot_id is not None and message.get("boot_id") != child.boot_id:
            return  # not this gateway's own answer
        was = child.watchdog.stage
        if child.watchdog.heartbeat(now):
            event = "recovered" if was is Stage.RELIEF else "healthy"
            self.record(event, gen=child.gen, boot_id=child.boot_id)
            self.notifier.ready("gateway healthy")
        if child.watchdog.stage is Stage.HEALTHY:
            self.notifier.watchdog()

    def _leaving(self, child: Child, kind: str, now: float) -> None:
        """The gateway said ``stop`` or ``restart``: it gets SHUTDOWN s to exit."""
        child.stop_said |= kind == "stop"
        child.restart_said |= kind == "restart"
        child.watchdog.leaving(now)
        self.record(f"{kind}_requested", gen=child.gen)

    def _repaired(self, child: Child) -> None:
        """A repair passed its checks: the budget, the backoff and recovery mode start over."""
        self.budget.repaired()
        self._report_persistence()
        self.backoff.reset()
        child.channel.send("recovery_mode", on=False)
        self.record("repaired", "repaired: restart budget cleared, recovery mode off")

    def _report_persistence(self) -> None:
        error = self.budget.persistence_error
        if error is not None and error != self._persistence_reported:
            self.record("persistence_failed", error=error)  # the budget has logged it
        self._persistence_reported = error

    def _act(self, child: Child, action: Action, now: float) -> None:
        pid = child.proc.pid
        s = child.watchdog.settings
        if action is Action.RELIEF:
            child.channel.send("relief")
            self.record(
                "relief",
                f"no healthy heartbeat for {s.heartbeat_s:g} s: relief asked",
                gen=child.gen,
            )
        elif action is Action.SIGTERM:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
            self.record("sigterm", f"still no heartbeat: SIGTERM to pid {pid}", gen=child.gen)
        else:
            count = kill_tree(child.root) if child.root is not None else 0
            self.record(
                "sigkill", f"pid {pid} did not exit: SIGKILL to {count} process(es)", gen=child.gen
            )

    def _stop(self, child: Child, now: float, signum: int) -> None:
        if self.stopping:  # a second signal: no more waiting
            self._act(child, Action.SIGKILL, now)
            return
        self.stopping = True
        self.notifier.stopping()
        self.record("stopping", f"signal {signum}: stopping the gateway", signal=signum)
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGTERM)
        child.watchdog.leaving(now)

    def _exited(self, child: Child, code: int, now: float) -> tuple[RestartReason, float] | None:
        child.channel.close()
        self.record("exited", gen=child.gen, exit_code=code, stage=child.watchdog.stage.value)
        if self.stopping or child.stop_said:
            return None
        if code == EXIT_CANNOT_START:
            self.record(
                "cannot_start",
                "the gateway cannot start (it said why above); a restart would not mend it: "
                "stopping",
                exit_code=code,
            )
            self.exit_code = code
            return None
        if child.restart_said and not child.watchdog.escalated:
            return RestartReason.REQUESTED, child.watchdog.healthy_for(now)
        if child.watchdog.escalated:
            return RestartReason.UNRESPONSIVE, child.watchdog.healthy_for(now)
        reason = RestartReason.EXITED if code == 0 else RestartReason.CRASH
        return reason, child.watchdog.healthy_for(now)

    def _next_launch(
        self, reason: RestartReason, healthy_for: float | None
    ) -> tuple[RestartReason, float]:
        s = self.settings()
        if reason is RestartReason.REQUESTED:
            verdict = self.budget.record_request(s.cooldown_s)
            if verdict.counted:
                reason = RestartReason.RAPID_REQUESTS
        else:
            verdict = self.budget.record_failure(reason, s.cooldown_s)
        delay = 0.0
        if verdict.counted:
            delay = self.backoff.next_delay(
                s.backoff_s, s.backoff_max_s, healthy_for=healthy_for or 0
            )
        self._report_persistence()
        if verdict.recovery_entered:
            self.record("recovery_mode_on", "repeated failures: recovery mode latched")
        if verdict.cooldown_s:
            delay = max(delay, verdict.cooldown_s)
            self.record(
                "cooldown",
                f"restart budget spent: no restart for {verdict.cooldown_s:g} s",
                s=verdict.cooldown_s,
            )
            # The supervisor is up and holding: READY=1, so a start does not hang on it.
            self.notifier.ready(f"cooldown: no restart for {verdict.cooldown_s:g} s")
        self.record("restart_scheduled", reason=reason.value, delay_s=delay)
        return reason, delay


def run_supervisor(
    port: int,
    socket_path: str | None,
    *,
    env: Mapping[str, str] | None = None,
    gateway_command: Sequence[str] | None = None,
    backoff_s: float = RESTART_BACKOFF_S,
    backoff_max_s: float = RESTART_BACKOFF_MAX_S,
) -> int:
    """Supervise ``roomkeeper gateway`` on ``port`` (or ``socket_path``); the exit status.

    Args:
        port: the gateway's loopback port.
        socket_path: the Unix socket it listens on instead, if any.
        env: the variables to read, and the base of the child's environment.
        gateway_command: the child's command line; by default ``python -m roomkeeper
            gateway`` on ``port`` (or ``socket_path``).  Tests pass a stand-in.
        backoff_s: the wait before the first restart after a failure, doubling from there.
        backoff_max_s: the longest wait between failure restarts.
    """
    env = os.environ if env is None else env
    if gateway_command is None:
        gateway_command = roomkeeper_gateway(port, socket_path)
    supervisor = Supervisor(
        gateway_command,
        env=env,
        backoff_s=backoff_s,
        backoff_max_s=backoff_max_s,
    )
    where = socket_path or f"http://127.0.0.1:{port}"
    log.info("supervisor (pid %d) watching the gateway on %s", os.getpid(), where)
    return supervisor.run()


def adopt(port: int, socket_path: str | None) -> int:
    """Take on supervision (a bare ``roomkeeper gateway``, ROOMKEEPER_SUPERVISE=1, no channel).

    The gateway this starts has a channel, so it never adopts again (exactly
    once).  The first launch keeps the reason it inherited
    (ROOMKEEPER_RESTART_REASON, else what the state file says the next launch
    was for), and recovery mode comes from the state file.
    """
    env = dict(os.environ)
    reason = RestartReason.parse(env.get("ROOMKEEPER_RESTART_REASON"))
    log.warning("supervisor: ROOMKEEPER_SUPERVISE=1 without a channel: taking on supervision")
    supervisor = Supervisor(roomkeeper_gateway(port, socket_path), env=env, reason=reason)
    supervisor.record("adopted", pid=os.getpid(), reason=supervisor.reason.value)
    return supervisor.run()


def _capabilities(hello: dict[str, Any]) -> frozenset[str]:
    """The capabilities a hello declares (anything but a list of strings declares none)."""
    caps = hello.get("capabilities")
    if not isinstance(caps, list):
        return frozenset()
    return frozenset(c for c in caps if isinstance(c, str))
