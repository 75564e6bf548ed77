"""The API's request bodies and path ids: strict, bounded, and saying what was wrong when
they are not.

Every model forbids unknown fields and bounds every string, list and number,
so a crafted or oversized body gets a 4xx, never a 500.  Types are strict
(``"memory_bytes": "100"`` or ``true`` is refused, not coerced to 100 or 1) and
no float may be ``NaN`` or infinite.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Annotated, Any, Literal

# Loaded with the gateway, not on the first request that carries a hook: checking a hook's
# URL uses it (roomkeeper.loopback.hooks imports it only then, for a batch's sake).
import httpx  # noqa: F401
from fastapi import Path as PathParam
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from roomkeeper.api.words import REASONS
from roomkeeper.errors import UsageError
from roomkeeper.guard.lease_terms import DEFAULT_TTL_S, LeaseTerms
from roomkeeper.loopback.hooks import ReleaseHook, parse_hook

NAME = r"^[A-Za-z0-9._:@-]+$"
# No NUL anywhere a process's argv, cwd or env goes (the kernel cannot take one).
NO_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(max_length=65536, pattern=NO_NUL)]
ENV_NAME = r"^[^=\x00]+$"
# Written out: pydantic would put the key's pattern under patternProperties, which leaves
# other keys (and their values) unconstrained in the document though the server refuses them.
EnvMap = Annotated[
    dict[Annotated[str, Field(max_length=1024, pattern=ENV_NAME)], Text],
    Field(max_length=1000),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": 1000,
            "propertyNames": {"maxLength": 1024, "pattern": ENV_NAME},
            "additionalProperties": {"type": "string", "maxLength": 65536, "pattern": NO_NUL},
        }
    ),
]


def _whole_number(value: object) -> object:
    """A JSON integer, as JSON Schema counts them (``1.0`` is one); never a bool or a string."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a whole number of bytes, not a string or a boolean")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


MAX_BYTES = 2**53  # 8 PiB; the largest integer every JSON parser holds exactly (a double)

# Strict as the models are, but JSON Schema's "integer" includes 1.0: what the schema
# admits, the server admits.
Bytes = Annotated[
    int,
    Strict(False),
    BeforeValidator(_whole_number),
    Field(ge=0, le=MAX_BYTES),
    # Written out: with the validator in front, pydantic would print its own ge/le words.
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_BYTES}),
]
# Imported at module level by the route modules so FastAPI can resolve it (they postpone
# annotations).
Id = Annotated[str, PathParam(max_length=200)]
"""A job, call or lease id in a route's path."""

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
LOOPBACK_URL = rf"^https?://(127(\.{_OCTET}){{3}}|localhost|\[::1\])(:{_PORT})?([/?#][!-~]*)?$"
"""What ``release.url`` may be, in the schema as on the server: http(s) on loopback."""

ERROR_REASONS = (
    "unauthorized",
    "not_found",
    "method_not_allowed",
    "invalid_request",
    "body_too_large",
    "host_not_allowed",
    "origin_not_allowed",
    "call_state",
    "no_supervisor",
    "shutting_down",
    "not_saved",
    "not_saved_in_time",
    "queue_full",
    "owner_queue_full",
    "closing",
    "duplicate",
    "followers_full",
    "already_ended",
    "not_ended",
    "in_doubt",
    "not_uncertain",
    "leases_full",
    "owner_leases_full",
    "cwd_not_found",
    "command_not_found",
    "never_fits",
    "not_a_repository",
    "invalid_branch",
    "branch_checked_out",
    "dirty_base",
    "worktree_failed",
    *(w.value for w in REASONS),
)
"""The closed vocabulary of an error's ``reason`` (the guard's refusals included)."""


class ValidationItem(BaseModel):
    """One thing wrong with a request: where, what, and which kind."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorOut(BaseModel):
    """Every error answer: a machine-readable ``reason`` beside the human ``detail``."""

    reason: Annotated[str, Field(json_schema_extra={"enum": list(ERROR_REASONS)})]
    detail: str
    errors: list[ValidationItem] | None = None
    summary: str | None = None


RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before asking again: nothing was queued or granted.",
        "schema": {"type": "integer", "minimum": 0},
        "required": True,
    }
}
"""The header every 429 carries (a queue or a cap is full; it frees as work ends)."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorOut, **({"headers": RETRY_AFTER} if status == 429 else {})}
    for status in (400, 401, 403, 404, 405, 409, 413, 422, 429, 503, 507)
}
"""The error answers any route may give, declared on every route of the document."""


class ReleaseIn(BaseModel):
    """A release hook: one loopback HTTP call made when the lease or job ends."""

    model_config = STRICT
    method: Literal["DELETE", "POST", "PUT", "PATCH", "GET"] = "DELETE"
    # The schema's pattern, checked here after the hook's own rules so that a refusal
    # says "loopback" in words: what the document admits, the server admits, no more.
    url: Annotated[str, Field(max_length=2048, json_schema_extra={"pattern": LOOPBACK_URL})]

    @field_validator("url")
    @classmethod
    def _loopback(cls, url: str) -> str:
        field = cls._field()
        try:
            parse_hook({"method": "DELETE", "url": url})
        except UsageError as err:
            raise ValueError(str(err).replace("release.", f"{field}.")) from None
        if not re.match(LOOPBACK_URL, url):
            raise ValueError(
                f"{field}.url must be http(s)://127.x.y.z, localhost or [::1], with an optional "
                f"port and path of printable ASCII (got {url[:100]!r})"
            )
        return url

    @classmethod
    def _field(cls) -> str:
        """The request field this hook is given in, for messages."""
        return "release"

    def hook(self) -> ReleaseHook:
        """The checked hook."""
        return parse_hook({"method": self.method, "url": self.url})


class RelieveIn(ReleaseIn):
    """A relieve hook: one loopback HTTP call the relief ladder makes, once at most, to ask a
    lease's holder to end that turn now (sustained memory pressure)."""

    method: Literal["DELETE", "POST", "PUT", "PATCH", "GET"] = "POST"

    @classmethod
    def _field(cls) -> str:
        return "relieve"


class WorktreeIn(BaseModel):
    """A git worktree for the job: of the local repository ``repo``, on ``branch``
    (``roomkeeper/<job id>`` when omitted).  The command runs inside it."""

    model_config = STRICT
    repo: Annotated[
        str, Field(min_length=1, max_length=4096, json_schema_extra={"pattern": r"^/[^\x00]*$"})
    ]
    # git's own rules are checked on the server (git check-ref-format); this bounds the text.
    branch: (
        Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._/-]+$")] | None
    ) = None

    @field_validator("repo")
    @classmethod
    def _absolute(cls, repo: str) -> str:
        if not repo.startswith("/") or "\x00" in repo:
            raise ValueError(
                f"worktree.repo must be an absolute path (got {repo[:200]!r}); "
                "give the repository's full path"
            )
        return repo


class JobIn(BaseModel):
    """A job to run: argv (no shell), for an owner, with what it is expected to take."""

    # A job runs in its cwd or in its worktree, never both: the document says so too.
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        json_schema_extra={"not": {"required": ["cwd", "worktree"]}},
    )
    # The program (argv[0]) is never empty; later arguments may be ("printf ''").
    argv: Annotated[
        list[Text],
        Field(
            min_length=1,
            max_length=4096,
            json_schema_extra={
                "prefixItems": [
                    {"type": "string", "minLength": 1, "maxLength": 65536, "pattern": NO_NUL}
                ]
            },
        ),
    ]
    owner: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] = "default"
    # Absolute: the schema says so, the validator below says it in words.
    cwd: (
        Annotated[
            str,
            Field(min_length=1, max_length=4096, json_schema_extra={"pattern": r"^/[^\x00]*$"}),
        ]
        | None
    ) = None
    env: EnvMap | None = None
    memory_bytes: Bytes | None = None
    disk_bytes: Bytes | None = None
    timeout_s: Annotated[float, Field(gt=0, le=10**7)] | None = None
    resumable: bool = False
    # Safe to stop and run again from the start when memory runs out.
    restartable: bool = False
    release: ReleaseIn | None = None
    # strict: a young job reserves its estimate less its footprint; pack: its forecast growth.
    memory_policy: Literal["strict", "pack"] = "strict"
    # The name its learned size is kept under (else a hash of argv and cwd).
    kind: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] | None = None
    worktree: WorktreeIn | None = None
    # A jobserver of its own: make, ninja and cargo in it start steps as memory allows.
    jobserver: bool = False

    @model_validator(mode="after")
    def _one_place(self) -> JobIn:
        if self.worktree is not None and self.cwd is not None:
            raise ValueError(
                "give cwd or worktree, not both: a job with a worktree runs inside its tree"
            )
        return self

    @field_validator("argv")
    @classmethod
    def _program_named(cls, argv: list[str]) -> list[str]:
        if argv and not argv[0]:
            raise ValueError("argv[0] is empty: give the program to run, a path or a name on PATH")
        return argv

    @field_validator("cwd")
    @classmethod
    def _absolute(cls, cwd: str | None) -> str | None:
        if cwd is not None and not cwd.startswith("/"):
            raise ValueError(
                f"cwd must be an absolute path (got {cwd!r}); give the directory's full path"
            )
        return cwd


class CallIn(BaseModel):
    """A client's side-effecting call, registered before it is dispatched."""

    model_config = STRICT
    kind: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)]
    owner: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] = "default"
    resumable: bool = False


class OutcomeIn(BaseModel):
    """How a registered call ended."""

    model_config = STRICT
    outcome: Literal["succeeded", "failed"]
    numbers: (
        Annotated[
            dict[
                Annotated[str, Field(max_length=100)], Annotated[float, Field(allow_inf_nan=False)]
            ],
            Field(max_length=50),
        ]
        | None
    ) = None
    error: Annotated[str, Field(max_length=4096)] | None = None


class ResolveIn(BaseModel):
    """How a person or the client settles uncertain work."""

    model_config = STRICT
    resolution: Literal["succeeded", "failed", "rerun"]


class LeaseIn(BaseModel):
    """A lease: admission for a turn that runs elsewhere.

    Its fields are the lease's terms (:class:`~roomkeeper.guard.lease_terms.LeaseTerms`, by
    the same names, bounded here), its ``id`` and how long the request may wait.
    """

    model_config = STRICT
    id: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] | None = None
    owner: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] = "default"
    memory_bytes: Bytes | None = None
    disk_bytes: Bytes | None = None
    ttl_s: Annotated[float, Field(gt=0, le=86400)] = DEFAULT_TTL_S
    wait_s: Annotated[float, Field(ge=0, le=600)] = 0.0
    release: ReleaseIn | None = None
    relieve: RelieveIn | None = None
    # The agent session it belongs to (Claude Code's or Codex's session_id), shown per session.
    session: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] | None = None
    # What sort of work it is: the memory its work gives back when it ends teaches the kind.
    kind: Annotated[str, Field(min_length=1, max_length=200, pattern=NAME)] | None = None

    def terms(self) -> LeaseTerms:
        """The terms asked for: each field of :class:`LeaseTerms` by name, hooks checked."""
        asked: dict[str, Any] = {}
        for f in fields(LeaseTerms):
            value = getattr(self, f.name)
            asked[f.name] = value.hook() if isinstance(value, ReleaseIn) else value
        return LeaseTerms(**asked)


class HeartbeatIn(BaseModel):
    """Extend a lease; its ttl from now (the lease's own when omitted)."""

    model_config = STRICT
    ttl_s: Annotated[float, Field(gt=0, le=86400)] | None = None
