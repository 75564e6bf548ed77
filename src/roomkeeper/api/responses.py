"""The API's success bodies as models, so that ``/openapi.json`` says what each route sends.

A client generated from the document gets real types, and schemathesis'
``response_schema_conformance`` checks every answer against them.  The
routes still build their answers in :mod:`roomkeeper.api.views`; each route
names its model here as its ``response_model`` and answers with
``response_model_exclude_unset``, so what goes on the wire is what the view
built, key for key.  A field with a default is one the view sends only
sometimes (``last_output`` of work in doubt, say); every other field is
always sent.  The models forbid extra keys: a view that grows a field the
document does not declare fails loudly in the tests instead of drifting from
the contract.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from roomkeeper.api.words import JOB_REASONS, WireReason
from roomkeeper.gateway.calls import CallState
from roomkeeper.gateway.headlines import HEADLINES, PERSON_HEADLINES
from roomkeeper.guard.leases import LeaseState
from roomkeeper.jobs.spec import JobState
from roomkeeper.journal.history import RecoveryCode
from roomkeeper.kernel.resources import MemorySource

OUT = ConfigDict(extra="forbid")

# Numbers stay as they were given (a float-only field would send an int 1 as 1.0); the
# document says "number", which JSON Schema's integers are part of.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]


def _closed(words: tuple[str, ...], what: str) -> AfterValidator:
    """A check that a string is one of ``words`` (the document lists them as an enum)."""

    def validate(value: str) -> str:
        if value not in words:
            raise ValueError(f"{what} {value!r} is not one of {', '.join(words)}")
        return value

    return AfterValidator(validate)


JOB_CODES = tuple(w.value for w in JOB_REASONS)
"""Why a job waits or ended (:data:`roomkeeper.api.words.JOB_REASONS`), as codes."""
JobReason = Annotated[
    str,
    _closed(JOB_CODES, "job reason"),
    WithJsonSchema({"type": "string", "enum": list(JOB_CODES)}),
]
FEED_SOURCES = (*(s.value for s in MemorySource), "not read")
FeedSource = Annotated[
    str,
    _closed(FEED_SOURCES, "memory source"),
    WithJsonSchema({"type": "string", "enum": list(FEED_SOURCES)}),
]
GUARD_HEADLINES = tuple(sorted({*HEADLINES.values(), *PERSON_HEADLINES}))
GuardHeadline = Annotated[
    str,
    _closed(GUARD_HEADLINES, "headline"),
    WithJsonSchema({"type": "string", "enum": list(GUARD_HEADLINES)}),
]


# ------------------------------------------------------------------ open routes


class HealthOut(BaseModel):
    """``GET /health``: this gateway process's boot id (the CLI checks it) and uptime."""

    model_config = OUT
    boot_id: str
    uptime_s: Number


# ------------------------------------------------------------------ jobs


class JobCreated(BaseModel):
    """``POST /v1/jobs``: the new job's id and its first state."""

    model_config = OUT
    id: str
    state: JobState


class WorktreeOut(BaseModel):
    """The git worktree a job asked for (its path is in GET /v1/workspaces once made)."""

    model_config = OUT
    repo: str
    branch: str | None


class TokensOut(BaseModel):
    """A running job's jobserver: its tokens, its step estimate, why no more were given."""

    model_config = OUT
    tokens_out: int = Field(description="Tokens its build tools hold now (minted less idle).")
    idle: int = Field(description="Tokens waiting unused in its FIFO.")
    minted: int = Field(description="Tokens minted in all.")
    steps: int = Field(description="Steps started and not ended, the paused ones included.")
    step_bytes: int = Field(
        description="The memory one more step is expected to take: the mean of its last "
        "finished steps (the largest until one finished); tokens are minted for it."
    )
    step_source: Literal["default", "learned", "running"]
    claim_bytes: int = Field(description="What the guard holds for its steps now.")
    reason: Literal["minted", "idle", "no_room", "pressure", "starting"]
    summary: str = Field(description='Why, in words, with the guard\'s numbers ("no room: ...").')
    lost: int = Field(description="Tokens lost with a client that died, minted again.")
    unread: int = Field(description="Bytes a client wrote back that it never read.")
    taken_back: int = Field(description="Idle tokens taken back under memory pressure.")
    paused: int = Field(
        description="Steps paused (SIGSTOP) until they can finish below the line beside the rest."
    )
    largest_step_bytes: int = Field(
        description="Its largest step (finished, or running now): each step is bounded by it."
    )


class JobOut(BaseModel):
    """A job of this run or an earlier one."""

    model_config = OUT
    id: str
    owner: str
    state: JobState
    reason: JobReason | None
    exit_code: int | None
    argv: list[str]
    submitted_at: Number
    started_at: Number | None
    ended_at: Number | None
    peak_bytes: int | None
    error: str | None
    worktree: WorktreeOut | None = Field(
        default=None, description="The git worktree it asked for, if it asked for one."
    )
    memory_policy: Literal["strict", "pack"] | None = Field(
        default=None, description="strict: reserves its estimate while young; pack: its growth."
    )
    estimate_bytes: int | None = Field(
        default=None, description="The memory estimate it was judged with."
    )
    estimate_source: Literal["stated", "learned", "default", "re-run"] | None = Field(
        default=None, description="Where the estimate came from."
    )
    shape_bytes: int | None = Field(
        default=None,
        description="A pack job with no estimate of its own: what runs of its command shape "
        "(the same program and script) typically peaked at, what its trial is expected to reach.",
    )
    kind: str | None = Field(default=None, description="The name its learned size is kept under.")
    jobserver: bool = Field(default=False, description="Whether it runs with a jobserver.")
    tokens: TokensOut | None = Field(
        default=None, description="Its jobserver's tokens while it runs with one."
    )
    resolution: Literal["succeeded", "failed"] | None = Field(
        default=None, description="How uncertain work was settled; sent for earlier runs' jobs."
    )
    last_output: str | None = Field(
        default=None, description="The last bytes of its output; sent for uncertain jobs only."
    )


class RegisteredWorktreeOut(BaseModel):
    """One job's git worktree, as ``GET /v1/workspaces`` lists it."""

    model_config = OUT

    path: str
    repo: str
    branch: str
    job_id: str
    state: str
    size_bytes: int
    protection: str | None = Field(
        description="why pruning keeps it (job_active, dispatching, changes, stash, "
        "unpushed, uninspectable); null: a prune may remove it"
    )
    registered_at: float


# ------------------------------------------------------------------ calls


class CallOut(BaseModel):
    """A registered side-effecting call."""

    model_config = OUT
    id: str
    kind: str
    owner: str
    resumable: bool
    state: CallState
    created_at: Number
    ended_at: Number | None
    numbers: dict[str, Number]
    error: str | None
    pending_marker: bool


class HistoryEventOut(BaseModel):
    """One recovery event: a timestamp, a reason code and numbers only (and, for a step of
    a Ray node's ladder, that node's id)."""

    model_config = OUT
    at: Number
    code: RecoveryCode
    numbers: dict[str, Number]
    node: str | None = None


# ------------------------------------------------------------------ leases


class ReleaseOut(BaseModel):
    """A release hook as it was accepted."""

    model_config = OUT
    method: Literal["DELETE", "POST", "PUT", "PATCH", "GET"]
    url: str


class LeaseOut(BaseModel):
    """A lease: admission for a turn that runs elsewhere."""

    model_config = OUT
    id: str
    owner: str
    state: LeaseState
    memory_bytes: int | None
    disk_bytes: int | None
    ttl_s: Number
    granted_at: Number
    expires_at: Number
    ended_at: Number | None
    release: ReleaseOut | None
    hook_outcome: str | None = Field(
        description="``ok <status>`` or ``failed: <why>`` once its hook ran; else null."
    )
    relieve: ReleaseOut | None
    relieve_outcome: str | None = Field(
        description="null until the relief ladder calls the relieve hook; ``asked`` while "
        "its memory is awaited; then ``relieved: ...`` or ``not relieved: ...``."
    )
    session: str | None = Field(description="The agent session it belongs to; null when not told.")
    kind: str | None = Field(
        description="What sort of work it is (its measured size teaches the kind); null if untold."
    )


class LeaseCounts(BaseModel):
    """Leases granted now, and how many ended each way (a way is sent once one ended so)."""

    model_config = OUT
    granted: int
    released: int = 0
    expired: int = 0
    relieved: int = 0


class SessionOut(BaseModel):
    """What one agent session (its ``session_id``) holds now: granted leases and their memory."""

    model_config = OUT
    leases: int
    memory_bytes: int


SESSIONS_FIELD = Field(
    description="Granted leases per agent session (the leases that named one), by session id."
)


class HookDecisionOut(BaseModel):
    """A coding agent's hook decision on one tool call, in the tool's own field names."""

    model_config = OUT
    hookEventName: Literal["PreToolUse"]  # noqa: N815 (the tool's own name)
    permissionDecision: Literal["deny", "defer"]  # noqa: N815
    permissionDecisionReason: str  # noqa: N815


class HookAnswerOut(BaseModel):
    """A hook event's answer, as Claude Code and Codex read it: ``{}`` for no decision."""

    model_config = OUT
    hookSpecificOutput: HookDecisionOut | None = Field(  # noqa: N815
        default=None,
        description="Sent only when the call may not start now: deny (saying why) or defer.",
    )


# ------------------------------------------------------------------ status and feed


class OwnerCounts(BaseModel):
    """One owner's jobs waiting and running."""

    model_config = OUT
    waiting: int
    running: int


class DecisionOut(BaseModel):
    """A decision of the guard."""

    model_config = OUT
    admit: bool
    reason: WireReason
    summary: str


class StatusGuard(BaseModel):
    """The guard's answer for one more job now, its reservations and its last decision."""

    model_config = OUT
    admit: bool
    reason: WireReason
    summary: str
    young: int
    reserved_bytes: int
    last_decision: DecisionOut | None


class StatusMemory(BaseModel):
    """Memory in use against the effective limit (nulls when unknown)."""

    model_config = OUT
    used_bytes: int | None
    limit_bytes: int | None
    source: MemorySource | None


class DiskOut(BaseModel):
    """The workspace volume's free and total space (nulls when unknown)."""

    model_config = OUT
    free_bytes: int | None
    total_bytes: int | None


class QueueOut(BaseModel):
    """The queue: counts, per owner, and refusals by reason."""

    model_config = OUT
    waiting: int
    running: int
    by_owner: dict[str, OwnerCounts]
    refusals: dict[str, int]
    last_refusal: str | None = Field(default=None, description="The last refusal, in words.")


class NodeOut(BaseModel):
    """One Ray node (backend ``ray``): its memory, our jobs there, its guard's last headroom."""

    model_config = OUT
    node_id: str
    address: str
    alive: bool
    memory_bytes: int
    cpus: Number
    reserved_bytes: int
    room_bytes: int
    running: int
    headroom_bytes: int | None
    headroom_at: Number | None
    held: bool = False  # its own pressure monitor holds launches there now
    suspended: int = 0  # our trees its monitor suspended, still holding their memory
    pressure_steps: dict[str, int] = {}  # the steps its monitor took, by step


class PressureOut(BaseModel):
    """The relief ladder: whether it holds launches, its counts and its reaction times."""

    model_config = OUT
    holding: bool
    cooldown_s: Number  # left on the one cooldown clock (the ladder's stop, a relief request)
    holds: int
    suspensions: int
    resumes: int
    stops: int
    reruns: int
    trial_pauses: int  # pauses of pack jobs on trial (packing at work, not a rung)
    reaction_p50_s: Number | None
    reaction_max_s: Number | None
    wakes_on: str  # the kernel notifications armed, or "polling only (...)"
    relieves: int  # leases whose holders the ladder asked to end their turn
    relieved: int  # ... and whose memory came back


class GrownOut(BaseModel):
    """One of the container's processes (not our jobs) and how much it grew."""

    model_config = OUT
    pid: int
    name: str
    bytes: int


class BaselineOut(BaseModel):
    """Memory no live work explains: used less our jobs' footprints and leases' reservations."""

    model_config = OUT
    baseline_bytes: int | None = Field(description="The latest record; null before the first.")
    then_bytes: int | None = Field(
        description="What growth is measured from; null until enough endings passed."
    )
    endings: int
    not_given_back: bool
    leases_ended_without_hook: int
    grew: list[GrownOut] = Field(
        description="The container's processes that are not our jobs, by growth of their "
        "resident memory since the gateway started, largest first."
    )


class StatusOut(BaseModel):
    """``GET /v1/status``."""

    model_config = OUT
    boot_id: str
    uptime_s: Number
    guard: StatusGuard
    memory: StatusMemory
    disk: DiskOut
    queue: QueueOut
    leases: LeaseCounts
    sessions: dict[str, SessionOut] = SESSIONS_FIELD
    backend: Literal["local", "ray"]
    nodes: list[NodeOut] = Field(description="Ray nodes; empty with the local backend.")
    holds: list[Literal["shutting down", "recovery mode", "relief", "memory pressure"]]
    pressure: PressureOut
    baseline: BaselineOut


class FeedGuard(BaseModel):
    """The guard's answer now, with the Health page's headline."""

    model_config = OUT
    admit: bool
    reason: WireReason
    headline: GuardHeadline
    summary: str


class FeedMemory(BaseModel):
    """Memory now, with the chart's line (``source`` is ``not read`` without a reading)."""

    model_config = OUT
    used_bytes: int | None
    limit_bytes: int | None
    line_bytes: int | None
    source: FeedSource


class SampleOut(BaseModel):
    """One point of the Health page's chart."""

    model_config = OUT
    at: Number
    used_bytes: int | None
    limit_bytes: int | None
    line_bytes: int | None
    disk_free_bytes: int | None
    disk_total_bytes: int | None
    running: int
    waiting: int
    baseline_bytes: int | None = None


class FeedJob(BaseModel):
    """A job (or a call left uncertain) as the Health page lists it: no command, no path."""

    model_config = OUT
    id: str
    owner: str
    state: JobState
    reason: JobReason | None
    exit_code: int | None
    submitted_at: Number
    started_at: Number | None
    ended_at: Number | None
    tokens: TokensOut | None = Field(
        default=None, description="Its jobserver's tokens while it runs with one."
    )


class FeedRefusal(BaseModel):
    """A recent refusal of the guard."""

    model_config = OUT
    at: Number
    reason: WireReason
    summary: str


class FeedRecovery(BaseModel):
    """A recent recovery event (``node``: the Ray node whose ladder took it)."""

    model_config = OUT
    at: Number
    reason: RecoveryCode
    node: str | None = None


class FeedOut(BaseModel):
    """``GET /v1/feed``: what the Health page shows, ids, owners, states and numbers only."""

    model_config = OUT
    boot_id: str
    uptime_s: Number
    now: Number
    guard: FeedGuard
    memory: FeedMemory
    disk: DiskOut
    history: list[SampleOut]
    owners: dict[str, OwnerCounts]
    jobs: list[FeedJob]
    refusals: list[FeedRefusal]
    recoveries: list[FeedRecovery]
    leases: LeaseCounts
    sessions: dict[str, SessionOut] = SESSIONS_FIELD
    backend: Literal["local", "ray"]
    nodes: list[NodeOut] = Field(description="Ray nodes; empty with the local backend.")


# ------------------------------------------------------------------ the service


class NeedsYouOut(BaseModel):
    """``GET /v1/needs-you``: a short headline and a sentence."""

    model_config = OUT
    headline: str
    body: str


class ShutdownOut(BaseModel):
    """``POST /v1/shutdown``."""

    model_config = OUT
    state: Literal["stopping"]


class RestartOut(BaseModel):
    """``POST /v1/restart``."""

    model_config = OUT
    state: Literal["restarting"]


class RepairOut(BaseModel):
    """``POST /v1/repair``: whether the checks passed, and why (not)."""

    model_config = OUT
    repaired: bool
    why: str


SENT_AS_BUILT: dict[str, Any] = {"response_model_exclude_unset": True}
"""Every route's answer is the view's keys, no more: a field with a default the view left out
stays out (see the module docstring)."""
