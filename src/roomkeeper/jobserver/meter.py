"""Tokens metered by memory: one meter per job's pool, all judged by one guard in rotation.

Before a job starts, its pool gets a token for one further step of the
default size if the guard has room for it (:meth:`Jobservers.open`): ninja
looks for a token only at its start and when a step ends.  Then each round
(every :data:`ROUND_S`), for each job in turn, owners rotating as the
scheduler's queue does:

1. Count: the idle tokens in the FIFO (``FIONREAD``), so the tokens out are
   those minted less those idle; and the job's clients and steps
   (:mod:`roomkeeper.jobserver.census`).
2. Settle the ledger: bytes in the FIFO beyond what we minted were written
   back by a client that never read them (taken out, said); tokens out beyond
   what the live clients' steps account for, for :data:`LOST_AFTER_S`, were
   lost with a client that died holding them (written off, so they can be
   minted again, said).
3. Learn the job's steps: the *largest* is the highest footprint a finished
   step of this job reached (a step's footprint grows after it took its
   token), raised at once by a running step already larger; the *typical*
   is the mean of its last finished steps.  Before any step has finished
   both are the guard's default job estimate.
4. Claim: what the job's steps are expected to grow by still (from the
   sizes its finished steps reached:
   :func:`~roomkeeper.jobserver.steps.expected_growth`), and the typical
   step for each token not yet seen as a step and each idle token.  The
   guard holds that claim for the job, so every other job's admission and
   every other pool's next token is judged beside it.
5. Mint one token when none is idle, no step of the job is paused, no other
   job waits for memory to start, the guard admits the claim, and every step
   started (every job's, and every job's tokens not yet seen as steps), with
   one more of the job's largest size, could still be finished below the
   line, one after another if need be
   (:mod:`roomkeeper.jobserver.steps`).  Under pressure, mint nothing and take
   every idle token back.

After every job's turn, the rule of :mod:`roomkeeper.jobserver.steps` is
kept over the steps of all jobs together: when the running steps' growth
would leave some step unable to finish below the line, running steps are
paused (SIGSTOP, their whole subtree), the furthest from its end first,
never the one nearest its end; a paused step goes on once it can run
beside the rest.  A job being stopped (:meth:`Jobservers.release`) gets no
more tokens and no more pauses, and its paused steps are sent SIGTERM and
then SIGCONT, so that they end at once instead of growing on; a job that
ends has its paused steps sent SIGCONT, so that they end with it.

So more steps run than a count that allows for the largest everywhere, and a
step that turns out large waits, holding what it has, instead of taking the
container past its line.

Every call on the FIFO is non-blocking and the rounds run on a thread of
their own: a client that misbehaves never stalls the scheduler.  Each job's
pool is its own FIFO, so no token can pass from one job to another.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

from roomkeeper.guard.admission import Guard
from roomkeeper.guard.lines import Reading
from roomkeeper.jobserver.census import Census, take_census
from roomkeeper.jobserver.flags import Command, prepare_command
from roomkeeper.jobserver.pool import TokenPool
from roomkeeper.jobserver.steps import (
    LOOK_AHEAD_S,
    Step,
    admits,
    expected_growth,
    step_need,
    to_pause,
    to_resume,
)
from roomkeeper.units import format_gb

log = logging.getLogger("roomkeeper")

ROUND_S = 0.1  # a token a round per job: ten steps a second is ample for a build
LOST_AFTER_S = 1.0  # a client reads a token before it forks: a shortfall must outlast that
LOOK_AHEAD_ROUNDS = 1.5  # growth allowed for: the time between the last two rounds, half again
# Tokens minted before a job starts, at most: one, so that ninja starts two steps; more would
# take the room of the jobs judged after it in the same launch round.
MAX_PRIMED = 1
TYPICAL_OF = 20  # the typical step is the mean of this many last finished steps
RATE_WINDOW_S = 0.5  # a running step's growth rate is taken over this much of its past


class _Described(enum.Enum):
    """A word with its description, as :class:`~roomkeeper.guard.rule.Word` writes them.

    Not a ``Word``: those are the reasons a *job* waits or ended, composed
    into one vocabulary for the wire; these describe a running job's pool,
    and ``pressure`` means something else here than the ladder's word.
    """

    _value_: str
    description: str

    def __new__(cls, code: str, description: str) -> Self:
        member = object.__new__(cls)
        member._value_ = code
        member.description = description
        return member


class TokenReason(_Described):
    """Why a job's pool got another token, or why not."""

    MINTED = "minted", "room for another step: a token was minted"
    IDLE = "idle", "a token waits unused in the FIFO"  # a client will take it, or none wants one
    # The guard refused the claim, a step could not be sure to finish, or another job waits.
    NO_ROOM = "no_room", "no room for another step"
    PRESSURE = "pressure", "memory pressure: no token minted, idle tokens taken back"
    STARTING = "starting", "the job has not started its first step yet"


class StepSource(_Described):
    """Where a job's step estimate (its typical step) comes from."""

    DEFAULT = "default", "the guard's default job estimate: no step has finished yet"
    LEARNED = "learned", "the mean footprint of this job's last finished steps"
    RUNNING = "running", "no step has finished, and a running one is larger than the default"


@dataclass(frozen=True, slots=True)
class JobserverStatistics:
    """A snapshot of one job's pool.

    Attributes:
        job_id: the job.
        owner: whose it is.
        fifo: the FIFO's path.
        tokens_out: tokens its clients hold now (minted less idle).
        idle: tokens in the FIFO now.
        minted: tokens minted in all (taken back and lost ones included).
        steps: steps running now, paused ones included.
        step_bytes: the step estimate: the typical step, for which tokens are minted.
        step_source: where the estimate comes from.
        claim_bytes: what the guard holds for the job's steps now.
        reason: why the last round gave a token, or why not.
        summary: that reason in words, with the guard's numbers ("no room: ...").
        lost: tokens written off as lost with a client that died, and minted again.
        unread: bytes a client wrote back that it never read (taken out).
        taken_back: idle tokens taken back under pressure.
        most_steps: the most steps seen running at once.
        paused: steps paused now until they can be finished beside the rest.
        largest_step_bytes: the largest step, which each step is bounded by.
    """

    job_id: str
    owner: str
    fifo: str
    tokens_out: int
    idle: int
    minted: int
    steps: int
    step_bytes: int
    step_source: StepSource
    claim_bytes: int
    reason: TokenReason
    summary: str
    lost: int = 0
    unread: int = 0
    taken_back: int = 0
    most_steps: int = 0
    paused: int = 0
    largest_step_bytes: int = 0


@dataclass(slots=True)
class _Meter:
    """One job's pool and ledger; changed under the meters' lock (by the rounds' thread, and
    by a job's open, release and close)."""

    job_id: str
    owner: str
    pool: TokenPool
    fifo: str
    members: Callable[[], Iterable[int]] | None = None
    circulating: int = 0  # minted and neither taken back nor written off
    minted: int = 0
    lost: int = 0
    unread: int = 0
    taken_back: int = 0
    learned: int = 0  # largest finished step
    finished: deque[int] = field(default_factory=lambda: deque(maxlen=TYPICAL_OF))
    peaks: dict[int, int] = field(default_factory=dict)  # running steps' highest footprints
    seen: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)  # (at, footprint)
    began: dict[int, float] = field(default_factory=dict)  # when each step was first seen
    rates: dict[int, float] = field(default_factory=dict)  # bytes/s while it last ran
    paused: set[int] = field(default_factory=set)  # steps SIGSTOPped by the rule
    unseen: int = 0  # tokens out not yet seen as steps, as of its last round
    ending: bool = False  # being stopped: no token minted, no step paused
    fastest: float = 0.0  # the steepest growth a step of this job showed
    largest: int = 0  # the largest step, as last learned
    short_since: float | None = None
    short_least: int = 0
    stats: JobserverStatistics | None = None
    notes: list[str] = field(default_factory=list)

    def key(self) -> str:
        return f"{self.job_id}/jobserver"


@dataclass(frozen=True, slots=True)
class JobserverSettings:
    """How the rounds run (every figure has a default; tests shorten them).

    Attributes:
        round_s: seconds between rounds.
        lost_after_s: how long a shortfall of steps must last before tokens count as lost.
        step_default: the step estimate before any step has finished; None: the guard's
            default job estimate.
        pools_dir: where FIFOs are made; None: ``roomkeeper-jobserver-<uid>`` in the
            temporary directory.
    """

    round_s: float = ROUND_S
    lost_after_s: float = LOST_AFTER_S
    step_default: int | None = None
    pools_dir: Path | None = None


class Jobservers:
    """Every jobserver of one scheduler, metered by its one guard.

    Args:
        guard: the guard that judges every job's next token beside every admission.
        settings: the rounds' figures.
        pressure: whether the relief ladder holds launches now; memory is under pressure
            then, and also whenever the guard's reading is past its line.
        others_wait: whether a job waits for memory to start: no token is minted then
            (a build would take, a step at a time, the room the job waits for).
        clock: monotonic seconds.
        kill: sends a signal to a pid (pausing and resuming steps).
    """

    def __init__(
        self,
        guard: Guard,
        settings: JobserverSettings | None = None,
        *,
        pressure: Callable[[], bool] | None = None,
        others_wait: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self._guard = guard
        self._settings = settings or JobserverSettings()
        self._pressure = pressure or (lambda: False)
        self._others_wait = others_wait or (lambda: False)
        self._clock = clock
        self._kill = kill
        self._lock = threading.Lock()
        self._meters: dict[str, _Meter] = {}
        self._turn = 0
        self._last_round: float | None = None
        self._look_ahead = LOOK_AHEAD_S  # growth allowed for before the next look, in seconds
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------ job's life

    def open(
        self,
        job_id: str,
        owner: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        shell: bool,
        cwd: str | None = None,
    ) -> tuple[Command, tuple[int, ...]]:
        """Make ``job_id``'s pool: the command to run under it and the descriptors to pass.

        Raises:
            JobserverError: the FIFO could not be made (the message says why and what to do).
        """
        pool = TokenPool(job_id, directory=self._settings.pools_dir)
        auth = pool.open()
        command = prepare_command(argv, env, auth, shell=shell, cwd=cwd)
        meter = _Meter(job_id, owner, pool, auth.fifo_path)
        with self._lock:
            old = self._meters.pop(job_id, None)
            self._meters[job_id] = meter
        if old is not None:
            old.pool.close()
        for note in command.notes:
            log.info("job %s: %s", job_id, note)
        with self._lock:
            self._prime(meter)
        return command, pool.client_fds if command.descriptors else ()

    def _prime(self, meter: _Meter) -> None:
        """Mint, before the job starts, a token for a further step of the default size if the
        guard has room for it now (at most :data:`MAX_PRIMED`).  ninja looks for a token only
        at its start and when a step ends: a token minted while its first step runs would wait
        unseen until that ends."""
        if self._pressure() or self._others_wait() or self._guard.memory_reading() is None:
            return  # under pressure, others waiting, or nothing to judge room by
        step = self._default_step()
        primed = 0
        while primed < MAX_PRIMED:
            # The job's own reservation holds its first step; the pool's, the tokens.
            decision = self._guard.admit(meter.key(), memory_bytes=step * (primed + 1))
            if not decision.admit or not meter.pool.mint(1):
                break
            primed += 1
            meter.circulating += 1
            meter.minted += 1
        self._guard.hold(meter.key(), step * primed)

    def attach(self, job_id: str, members: Callable[[], Iterable[int]]) -> None:
        """The job started: ``members`` lists its tree's pids; rounds begin for it."""
        with self._lock:
            meter = self._meters.get(job_id)
            if meter is None:
                return
            meter.members = members
            meter.pool.release_client_fds()
        self._ensure_thread()

    def release(self, job_id: str) -> None:
        """The job is being stopped: its paused steps get SIGTERM and then SIGCONT, so that
        they end of it at once, not of the SIGKILL after the grace; pause none again, mint no
        more.  Its rounds end here; :meth:`close` still removes its pool once it ended."""
        with self._lock:
            meter = self._meters.get(job_id)
            if meter is None or meter.ending:
                return
            meter.ending = True
            paused = sorted(meter.paused)
            meter.paused.clear()
        self._guard.release(meter.key())
        for pid in paused:
            # SIGTERM first, pending while it is stopped: let go, it ends at once instead of
            # growing until the stop's own SIGTERM reaches it.
            self._signal_step(pid, signal.SIGTERM)
            self._signal_step(pid, signal.SIGCONT)

    def close(self, job_id: str) -> list[str]:
        """The job ended (or never started): remove its pool; what went wrong with its tokens."""
        with self._lock:
            meter = self._meters.pop(job_id, None)
        if meter is None:
            return []
        self._guard.release(meter.key())
        for pid in sorted(meter.paused):  # a paused step must be able to end with its job
            self._signal_step(pid, signal.SIGCONT)
        notes = list(meter.notes)
        with contextlib.suppress(OSError):
            out = meter.circulating - meter.pool.idle()
            if out > 0:
                notes.append(
                    f"{out} token(s) were never returned by the job's build tools; "
                    "they ended with its FIFO, no other job's pool was touched"
                )
        meter.pool.close()
        for note in notes[len(meter.notes) :]:
            log.info("job %s: %s", job_id, note)
        return notes

    def shutdown(self) -> None:
        """Stop the rounds and remove every pool."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        for job_id in list(self._meters):
            self.close(job_id)

    # ------------------------------------------------------------ reading

    def statistics(self) -> dict[str, JobserverStatistics]:
        """Each live pool's last snapshot, by job id."""
        with self._lock:
            return {j: m.stats for j, m in self._meters.items() if m.stats is not None}

    def notes(self, job_id: str) -> list[str]:
        """What went wrong with ``job_id``'s tokens so far, in words."""
        with self._lock:
            meter = self._meters.get(job_id)
            return [] if meter is None else list(meter.notes)

    # ------------------------------------------------------------ rounds

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="jobservers", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._settings.round_s):
            try:
                self.round()
            except Exception:  # one bad round must not end the metering of every job
                log.exception("a jobserver round failed")

    def round(self) -> None:
        """One round over every started job, in rotation; the rounds' thread calls it."""
        with self._lock:
            meters = [m for m in self._meters.values() if m.members is not None and not m.ending]
        order = _rotation(meters, self._turn)
        self._turn += 1
        # On a slow or busy machine rounds come further apart than ROUND_S: the growth allowed
        # for before the next look follows the time the last round took to come.
        now = self._clock()
        if self._last_round is not None:
            self._look_ahead = max(LOOK_AHEAD_S, LOOK_AHEAD_ROUNDS * (now - self._last_round))
        self._last_round = now
        reading = self._guard.memory_reading()
        past_line = reading is not None and reading.used > reading.hold_line
        pressure = self._pressure() or past_line
        for meter in order:
            if meter.ending:
                continue  # released since the list was made: its tree may be stopping
            # Outside the lock: listing a tree waits on the process's own lock, which a stop
            # holds through its grace; a pool's end or release must not wait on that.
            census = _census(meter)
            with self._lock:
                if census is None or self._meters.get(meter.job_id) is not meter or meter.ending:
                    continue  # going away, closed or being stopped meanwhile
                self._meter_one(meter, census, pressure, reading, order)
        if reading is not None:
            with self._lock:
                live = [m for m in order if self._meters.get(m.job_id) is m and not m.ending]
                self._keep_finishable(live, reading)

    def _meter_one(
        self,
        meter: _Meter,
        census: Census,
        pressure: bool,
        reading: Reading | None,
        meters: list[_Meter],
    ) -> None:
        idle = self._settle(meter, census)
        largest = self._learn(meter, census)
        self._track(meter, census)
        typical = _typical(meter, largest)
        out = meter.circulating - idle
        unseen = max(0, out + 1 - len(census.steps))  # tokens taken, steps not seen yet
        meter.unseen = unseen
        claim = sum(
            expected_growth(s.footprint, meter.finished, largest, s.rate)
            for s in self._steps([meter])
        )
        claim += typical * unseen + typical * idle
        room = None if reading is None else _Room(reading.hold_line - reading.used, meters)
        reason, summary = self._give(meter, census, idle, claim, typical, pressure, room)
        idle = meter.pool.idle()
        meter.stats = JobserverStatistics(
            job_id=meter.job_id,
            owner=meter.owner,
            fifo=meter.fifo,
            tokens_out=max(0, meter.circulating - idle),
            idle=idle,
            minted=meter.minted,
            steps=len(census.steps),
            step_bytes=typical,
            step_source=self._source(meter, largest),
            claim_bytes=claim,
            reason=reason,
            summary=summary,
            lost=meter.lost,
            unread=meter.unread,
            taken_back=meter.taken_back,
            most_steps=max(len(census.steps), meter.stats.most_steps if meter.stats else 0),
            paused=len(meter.paused),
            largest_step_bytes=largest,
        )

    def _track(self, meter: _Meter, census: Census) -> None:
        """Each running step's recent footprints and growth rate; forget the steps that ended."""
        now = self._clock()
        for pid in [p for p in meter.seen if p not in census.steps]:
            meter.seen.pop(pid, None)
            meter.began.pop(pid, None)
            meter.rates.pop(pid, None)
            if pid in meter.paused:  # no step any more (its client ended): never left stopped
                meter.paused.discard(pid)
                self._signal_step(pid, signal.SIGCONT)
        for pid, footprint in census.steps.items():
            seen = meter.seen.setdefault(pid, deque())
            meter.began.setdefault(pid, now)
            if pid in meter.paused:
                # A paused step keeps the rate it had while it ran; its samples while paused
                # would make that rate look slower once it goes on.
                seen.clear()
                seen.append((now, footprint))
                continue
            seen.append((now, footprint))
            while len(seen) > 2 and now - seen[1][0] >= RATE_WINDOW_S:
                seen.popleft()
            if len(seen) < 2:
                continue
            (then, before), last = seen[0], seen[-1][1]
            rate = max(0.0, (last - before) / (now - then)) if now > then else 0.0
            meter.rates[pid] = rate
            meter.fastest = max(meter.fastest, rate)

    def _steps(self, meters: Iterable[_Meter]) -> list[Step]:
        """Every tracked step of ``meters``, as :mod:`roomkeeper.jobserver.steps` sees it."""
        found = []
        for meter in meters:
            for pid, seen in meter.seen.items():
                footprint = seen[-1][1]
                rate = meter.rates.get(pid, _first_rate(meter))
                found.append(
                    Step(
                        key=(meter.job_id, pid),
                        began=meter.began[pid],
                        footprint=footprint,
                        need=step_need(
                            meter.largest, footprint, rate, meter.learned or self._default_step()
                        ),
                        rate=rate,
                        paused=pid in meter.paused,
                    )
                )
        return found

    def _keep_finishable(self, meters: list[_Meter], reading: Reading) -> None:
        """Pause running steps, the furthest from its end first, while their growth would leave
        some step unable to finish below the line; else let the paused step nearest its end go
        on if every step can still finish with it running (:mod:`roomkeeper.jobserver.steps`)."""
        by_job = {m.job_id: m for m in meters}
        steps = self._steps(meters)
        room = reading.hold_line - reading.used
        for meter in meters:
            for pid in meter.paused:  # still stopped, whoever sent SIGCONT since
                self._signal_step(pid, signal.SIGSTOP)
        pausing = to_pause(steps, room, self._look_ahead)
        for job_id, pid in pausing:
            if not self._signal_step(pid, signal.SIGSTOP):
                log.info("job %s: step %d cannot be paused: it ended, or is not ours", job_id, pid)
                continue
            by_job[job_id].paused.add(pid)
            log.info(
                "job %s: step %d paused: growing beside the rest, not every step could finish "
                "below the line (used %s of line %s)",
                job_id,
                pid,
                format_gb(reading.used),
                format_gb(reading.hold_line),
            )
        if pausing:
            return
        resumed = to_resume(steps, room, self._look_ahead)
        if resumed is not None:
            job_id, pid = resumed
            by_job[job_id].paused.discard(pid)
            self._signal_step(pid, signal.SIGCONT)
            log.info("job %s: step %d goes on: it can finish beside the rest", job_id, pid)

    def _signal_step(self, pid: int, signum: int) -> bool:
        """Send ``signum`` to a step and then every process under it (gone ones are skipped);
        whether the step got it.  A step that refuses it (a setuid program the job started)
        has none of its tree signalled: its children stopped while it is not counted as
        paused would never be sent SIGCONT."""
        children: list[int] = []
        with contextlib.suppress(psutil.Error):
            children = [c.pid for c in psutil.Process(pid).children(recursive=True)]
        try:
            self._kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        for each in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):  # gone, or not ours
                self._kill(each, signum)
        return True

    def _settle(self, meter: _Meter, census: Census) -> int:
        """Take out bytes nobody read, write off tokens lost with dead clients; idle now."""
        idle = meter.pool.idle()
        if idle > meter.circulating:
            extra = meter.pool.take_back(idle - meter.circulating)
            meter.unread += extra
            self._note(
                meter,
                f"a client wrote back {extra} byte(s) it never read: taken out of the FIFO "
                "(a build tool that returns more tokens than it took)",
            )
            idle = meter.pool.idle()
        short = meter.circulating - idle - census.may_hold
        now = self._clock()
        if short <= 0 or not census.clients:
            meter.short_since = None
            return idle
        if meter.short_since is None:
            meter.short_since, meter.short_least = now, short
            return idle
        meter.short_least = min(meter.short_least, short)
        if now - meter.short_since >= self._settings.lost_after_s:
            lost = meter.short_least
            meter.circulating -= lost
            meter.lost += lost
            meter.short_since = None
            self._note(
                meter,
                f"{lost} token(s) lost with a client that ended holding them: minted again "
                "as room allows",
            )
        return idle

    def _learn(self, meter: _Meter, census: Census) -> int:
        """The largest step: the largest finished step, or the default; a running step above
        it raises it.  Each step that finished adds its peak to those the typical is of."""
        for pid in [p for p in meter.peaks if p not in census.steps]:
            peak = meter.peaks.pop(pid)
            meter.learned = max(meter.learned, peak)
            meter.finished.append(peak)
        for pid, footprint in census.steps.items():
            meter.peaks[pid] = max(meter.peaks.get(pid, 0), footprint)
        base = meter.learned or self._default_step()
        meter.largest = max(base, *meter.peaks.values()) if meter.peaks else base
        return meter.largest

    def _source(self, meter: _Meter, largest: int) -> StepSource:
        if meter.finished:
            return StepSource.LEARNED
        return StepSource.RUNNING if largest > self._default_step() else StepSource.DEFAULT

    def _default_step(self) -> int:
        stated = self._settings.step_default
        return stated if stated is not None else self._guard.estimate(None)

    def _give(
        self,
        meter: _Meter,
        census: Census,
        idle: int,
        claim: int,
        step: int,
        pressure: bool,
        room: _Room | None,
    ) -> tuple[TokenReason, str]:
        """Mint a token if one is wanted and fits, or take idle ones back under pressure.

        ``room`` is None where memory is unknown: the guard alone judges then."""
        key = meter.key()
        if pressure:
            taken = meter.pool.take_back(idle)
            meter.circulating -= taken
            meter.taken_back += taken
            self._guard.hold(key, claim - step * taken)
            return TokenReason.PRESSURE, "memory pressure: no token minted, idle ones taken back"
        if not census.clients:
            self._guard.hold(key, claim)
            return TokenReason.STARTING, TokenReason.STARTING.description
        if meter.paused:
            self._guard.hold(key, claim)
            return TokenReason.PRESSURE, (
                f"{len(meter.paused)} step(s) paused until they can finish beside the rest: "
                "no token minted"
            )
        if self._others_wait():
            self._guard.hold(key, claim)
            return TokenReason.NO_ROOM, "no room: another job waits for memory to start"
        if idle > 0:
            self._guard.hold(key, claim)
            return TokenReason.IDLE, f"{idle} token(s) wait unused in the FIFO"
        if room is not None and not self._finishable_with_one_more(meter, room):
            self._guard.hold(key, claim)
            return TokenReason.NO_ROOM, (
                f"no room: one more step of up to {format_gb(meter.largest)} (this job's "
                f"largest) might not finish below the line beside the {len(census.steps)} "
                "running"
            )
        decision = self._guard.admit(key, memory_bytes=claim)
        if not decision.admit:
            self._guard.hold(key, claim)
            return TokenReason.NO_ROOM, f"no room: {decision.summary}"
        if meter.pool.mint(1):
            meter.circulating += 1
            meter.minted += 1
            # Held for the new token at once, so a job judged after this one in the same round
            # finds its room taken; the next round counts it from the census.
            meter.unseen += 1
            self._guard.hold(key, claim + step)
        return TokenReason.MINTED, f"room for another step of {format_gb(step)}"

    def _finishable_with_one_more(self, meter: _Meter, room: _Room) -> bool:
        """Whether every step, every job's tokens not yet seen as steps (minted earlier in
        this round included), and one more of this job, could still each finish below the
        line."""
        now = self._clock()
        # A step not seen yet grows from nothing: the next look sees it, and pauses it unless
        # it fits; so it adds no growth before the next look here.
        coming = [
            Step((f"token:{m.job_id}", n), now, 0, m.largest, 0.0)
            for m in room.meters
            for n in range(m.unseen)
        ]
        new = Step((f"token:{meter.job_id}", -1), now, 0, meter.largest, 0.0)
        return admits([*self._steps(room.meters), *coming], room.below_line, new, self._look_ahead)

    def _note(self, meter: _Meter, text: str) -> None:
        meter.notes.append(text)
        log.warning("job %s: %s", meter.job_id, text)


@dataclass(frozen=True, slots=True)
class _Room:
    """What a job's next token is judged in: the room below the line and every job's meter
    (their steps and tokens not yet seen as steps share the room)."""

    below_line: int
    meters: list[_Meter]


def _census(meter: _Meter) -> Census | None:
    """One look at the job's tree; None while it is going away."""
    members = meter.members
    assert members is not None
    try:
        return take_census(members(), meter.fifo)
    except Exception:  # a tree that is going away: nothing to give it
        return None


def _typical(meter: _Meter, largest: int) -> int:
    """The typical step: the mean of the last finished ones; the largest before any finished."""
    if not meter.finished:
        return largest
    return min(largest, sum(meter.finished) // len(meter.finished))


def _first_rate(meter: _Meter) -> float:
    """What a step not yet seen growing is taken to grow by: the steepest of its job so far,
    else its whole largest step in a second."""
    return meter.fastest or float(meter.largest)


def _rotation(meters: list[_Meter], turn: int) -> list[_Meter]:
    """Jobs in owner rotation: owners take turns being first, and within an owner its jobs."""
    owners = sorted({m.owner for m in meters})
    if not owners:
        return []
    start = turn % len(owners)
    ordered = owners[start:] + owners[:start]
    by_owner = {o: [m for m in meters if m.owner == o] for o in owners}
    out: list[_Meter] = []
    for owner in ordered:
        jobs = by_owner[owner]
        shift = (turn // len(owners)) % len(jobs)
        out.extend(jobs[shift:] + jobs[:shift])
    return out
