"""Jobs as the scheduler and its callers see them: what to run, and where it stands."""

from __future__ import annotations

import enum
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from roomkeeper.errors import UnrunnableError, UsageError
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.guard.rule import Word
from roomkeeper.processes.peaks import PeakMethod
from roomkeeper.worktrees.request import Worktree, WorktreeRequest

KIND_PATTERN = r"[A-Za-z0-9._:@-]{1,200}"
"""What a job's ``kind`` may be: a name (letters, digits, ``. _ : @ -``), at most 200 long."""


class JobState(enum.Enum):
    """Where a job stands; every change is recorded with a timestamp."""

    WAITING = "waiting"  # queued, with a reason
    RUNNING = "running"
    SUSPENDED = "suspended"  # running, but frozen by the relief ladder: nothing lost, not final
    EXITED = "exited"  # ended by itself, with an exit code (zero or not)
    FAILED = "failed"  # could not start
    CANCELLED = "cancelled"  # cancelled before it started
    EXPIRED = "expired"  # its deadline passed while it waited
    TIMED_OUT = "timed_out"  # its deadline passed while it ran: its tree was stopped
    STOPPED = "stopped"  # stopped by roomkeeper or a person while running
    UNCERTAIN = "uncertain"  # in flight when the gateway died: never re-run blindly
    DEFERRED = "deferred"  # resumable work a crash interrupted: resumed one at a time
    RESOLVED = "resolved"  # uncertain work a person or client settled (succeeded or failed)

    @property
    def final(self) -> bool:
        """Whether the job has ended."""
        return self not in (JobState.WAITING, JobState.RUNNING, JobState.SUSPENDED)

    @property
    def live(self) -> bool:
        """Whether the job's tree exists now (running or suspended)."""
        return self in (JobState.RUNNING, JobState.SUSPENDED)


class SchedulerReason(Word):
    """Why the scheduler holds a job back, or refused or ended it, beside the guard's rule."""

    # Above ROOMKEEPER_CPU_PRESSURE_PERCENT here, or a batch given no count keeps every core
    # busy (jobs/cores.py); on a cluster, no node with room has a CPU free.
    CPU = "cpu", "CPU under pressure"
    SLOTS = "slots", "all running slots busy"  # ROOMKEEPER_MAX_RUNNING jobs run
    OWNER_SLOTS = "owner_slots", "owner's running slots busy"  # ROOMKEEPER_MAX_RUNNING_PER_OWNER
    QUEUED = "queued", "waiting for its turn"  # not judged yet
    SHUTDOWN = "shutdown", "ended by an orderly shutdown"  # not by a person: recovery may defer it
    HELD = "held", "launches held (relief or recovery mode)"  # a person or time releases them
    QUEUE_FULL = "queue_full", "queue full"  # submission refused: ROOMKEEPER_MAX_WAITING jobs wait
    OWNER_QUEUE_FULL = "owner_queue_full", "owner's queue full"  # submission refused


class EstimateSource(enum.Enum):
    """Where a job's memory estimate came from: every estimate shown says so."""

    STATED = "stated"  # the submitter gave it (memory_bytes, --memory, --job-memory)
    LEARNED = "learned"  # the highest peak of the last runs of the same kind
    DEFAULT = "default"  # ROOMKEEPER_JOB_MEMORY_MB: nothing stated, nothing learned yet
    RERUN = "re-run"  # grown from its own run that the relief ladder stopped


@dataclass(frozen=True, slots=True)
class Estimate:
    """A job's memory estimate, resolved once when it is submitted, and where it came from.

    The relief ladder, placement and a launch on another machine, the hold
    after a job ends and the job view all read this one figure.  The guard's
    admission is told the figure when it was stated or learned; for a default
    it applies its own default of the moment (:attr:`known` is None), which
    follows the container's line should it have moved since submission.
    """

    bytes: int
    source: EstimateSource

    @property
    def known(self) -> int | None:
        """The figure the guard is asked with: None for a default, which says nothing of
        this job, so the guard applies its own default (and never calls it unfittable)."""
        return None if self.source is EstimateSource.DEFAULT else self.bytes


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run, for whom, and what it is expected to take.

    Attributes:
        argv: the command; never run through a shell unless ``shell`` is set
            (then ``argv`` is one string of shell text, run with ``/bin/sh -c``).
        owner: who the job is for; fairness rotates between owners.
        cwd: working directory; the scheduler's own when None.
        env: the job's environment: the whole of it, or (``inherit_env``) the
            variables set over the scheduler's own; inherited when None.
        memory_bytes: memory estimate; ROOMKEEPER_JOB_MEMORY_MB when None.
        disk_bytes: disk estimate; ROOMKEEPER_JOB_DISK_MB when None.
        timeout_s: deadline counted from submission, waiting time included.
        shell: run ``argv[0]`` as shell text.
        resumable: safe to run again if a crash interrupts it (then it is
            deferred and resumed, instead of shown as uncertain).
        restartable: safe to stop and run again from the start when memory
            runs out (every ``batch`` line is): the relief ladder then queues it
            again with an estimate grown from its run (:mod:`roomkeeper.jobs.reruns`),
            at most ROOMKEEPER_PRESSURE_RETRIES times.  Other work is never re-run silently.
        inherit_env: ``env`` holds only what the submitter gave, set over the
            scheduler's environment (less ``ROOMKEEPER_*``) when the job
            launches; the journal then never stores the inherited variables.
        worktree: run in a git worktree of this repository, made after
            admission and before the command starts (then ``cwd`` is not used).
        memory_policy: what the job reserves while young (``strict``: its
            estimate less its footprint; ``pack``: its forecast growth).
        kind: the name its learned size is kept under; without one, a hash of
            its argv and cwd (see :mod:`roomkeeper.jobs.sizes`).
        learned_bytes: the size past runs of its kind peaked at, found when it
            was submitted; used when ``memory_bytes`` is None.
        shape_bytes: what past runs of its command shape typically peaked at (the
            median of their last runs; :mod:`roomkeeper.jobs.sizes`), found when a
            ``pack`` job was submitted with nothing stated or learned: a guess, which sizes
            only its trial (:mod:`roomkeeper.guard.packing`), never its estimate.
        jobserver: run it with a jobserver of its own (:mod:`roomkeeper.jobserver`):
            make, ninja and cargo inside it start a step only when a token minted
            by memory lets them.
    """

    argv: Sequence[str]
    owner: str = "default"
    cwd: str | None = None
    env: Mapping[str, str] | None = None
    memory_bytes: int | None = None
    disk_bytes: int | None = None
    timeout_s: float | None = None
    shell: bool = False
    resumable: bool = False
    inherit_env: bool = False
    restartable: bool = False
    worktree: WorktreeRequest | None = None
    memory_policy: MemoryPolicy = MemoryPolicy.STRICT
    kind: str | None = None
    learned_bytes: int | None = None
    jobserver: bool = False
    shape_bytes: int | None = None

    @property
    def memory_estimate(self) -> int | None:
        """The estimate the guard is asked with: stated, else learned (None: the default)."""
        return self.memory_bytes if self.memory_bytes is not None else self.learned_bytes

    @property
    def estimate_source(self) -> EstimateSource:
        """Where :attr:`memory_estimate` comes from."""
        if self.memory_bytes is not None:
            return EstimateSource.STATED
        if self.learned_bytes is not None:
            return EstimateSource.LEARNED
        return EstimateSource.DEFAULT

    def resolve_estimate(self, default_bytes: int) -> Estimate:
        """The job's estimate: stated, else learned, else ``default_bytes``, and which."""
        estimate = self.memory_estimate
        return Estimate(
            default_bytes if estimate is None else max(0, estimate), self.estimate_source
        )

    def environment(self) -> Mapping[str, str] | None:
        """The whole environment the job launches with (None: the scheduler's own)."""
        if not self.inherit_env:
            return self.env
        return {**inherited_environment(), **(self.env or {})}

    def validate(self) -> None:
        """Raise :class:`UsageError` saying what is wrong with this spec, if anything."""
        if not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise UsageError("argv must be a non-empty list of strings", name="argv")
        if self.shell and len(self.argv) != 1:
            raise UsageError(
                f"a shell job takes one string of shell text (got {len(self.argv)} items)",
                name="argv",
            )
        texts = [*self.argv, self.cwd or "", *(self.env or {}), *(self.env or {}).values()]
        if any("\x00" in t for t in texts):
            raise UsageError("argv, cwd and env must not contain NUL characters", name="argv")
        if any(not k or "=" in k for k in self.env or {}):
            raise UsageError("env names must be non-empty and contain no '='", name="env")
        if not self.owner:
            raise UsageError("owner must be a non-empty name", name="owner")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise UsageError(f"timeout_s must be > 0 (got {self.timeout_s})", name="timeout_s")
        for name in ("memory_bytes", "disk_bytes", "learned_bytes", "shape_bytes"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"{name} must be >= 0 (got {value})", name=name)
        if self.kind is not None:
            validate_kind(self.kind)


def validate_kind(kind: str) -> str:
    """Return ``kind`` if it is a valid name.

    Raises:
        UsageError: it is empty, too long, or has a character outside the name's set.
    """
    if not re.fullmatch(KIND_PATTERN, kind):
        raise UsageError(
            f"kind must be 1 to 200 letters, digits or . _ : @ - (got {kind[:100]!r}); "
            "name the kind of work, e.g. 'unit-tests' or 'build:linux'",
            name="kind",
        )
    return kind


def inherited_environment() -> dict[str, str]:
    """This process's environment without ``ROOMKEEPER_*``: what a job inherits."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}


def validate_runnable(spec: JobSpec) -> None:
    """What a submission can check before anything starts: the directory and the command.

    Not part of :meth:`JobSpec.validate`, which runs again when deferred work is
    resumed after a restart: a directory gone since then fails that job at
    launch, with its reason, instead of failing the recovery.

    Raises:
        UnrunnableError: ``cwd`` is not an existing directory, or ``argv[0]`` does not
            resolve to an executable on the job's own PATH; the message says which.
    """
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise UnrunnableError(
            f"cwd {spec.cwd!r} is not an existing directory; create it or give another",
            reason="cwd_not_found",
            name="cwd",
        )
    if spec.shell:
        return  # the shell finds the command when it runs
    program = spec.argv[0]
    path = (spec.env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if "/" in program:
        where = program if os.path.isabs(program) else os.path.join(spec.cwd or ".", program)
        found = where if os.path.isfile(where) and os.access(where, os.X_OK) else None
    else:
        found = shutil.which(program, path=path)
    if found is None:
        raise UnrunnableError(
            f"argv[0] {program!r} is not an executable file"
            + ("" if "/" in program else " on the job's PATH")
            + "; check the name, give its full path, or set env.PATH",
            reason="command_not_found",
            name="argv",
        )


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change: the new state, when (wall-clock seconds), and why if waiting."""

    state: JobState
    at: float
    reason: Word | None


@dataclass(frozen=True, slots=True)
class JobView:
    """A snapshot of one job.

    Attributes:
        reason: why it waits (None once it runs or has ended).
        exit_code: the leader's exit status; negative for a signal, as subprocess reports.
        peak_bytes: the highest memory its tree held, when measured.
        peak_method: how ``peak_bytes`` was taken (the journal keeps the bytes only).
        worktree: the git worktree the job runs in, once made (its spec asked for one).
        error: why it could not start (state ``failed``).
        history: every state change, oldest first.
    """

    id: str
    spec: JobSpec
    state: JobState
    reason: Word | None
    exit_code: int | None
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    log_path: str
    peak_bytes: int | None
    error: str | None
    history: tuple[Transition, ...]
    pid: int | None = None
    peak_method: PeakMethod | None = None
    worktree: Worktree | None = None  # the job's git worktree, once made
    # The memory estimate it runs with: resolved at submission, grown for a re-run after a stop.
    estimate_bytes: int | None = None
    estimate_source: EstimateSource = EstimateSource.DEFAULT  # where that estimate came from

    @property
    def owner(self) -> str:
        """Who the job is for."""
        return self.spec.owner
