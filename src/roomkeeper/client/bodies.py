"""The bodies the clients send, checked by the API's own models before they go: a lease's
grant (:class:`LeaseAsk`) and a job (:func:`job_body`).  A value the gateway would refuse
is a :class:`~roomkeeper.errors.UsageError` here, said as the gateway says it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from roomkeeper.api.models import JobIn, LeaseIn
from roomkeeper.errors import UsageError
from roomkeeper.guard.lease_terms import DEFAULT_TTL_S
from roomkeeper.units import parse_size


def size_of(memory: int | str | None, what: str = "memory") -> int | None:
    """Bytes from an int or a size such as ``600M``; None stays None.

    Raises:
        UsageError: a negative number, or a size that cannot be read.
    """
    if memory is None:
        return None
    if isinstance(memory, bool) or not isinstance(memory, (int, str)):
        raise UsageError(f"{what} must be bytes or a size like '600M' (got {memory!r})", name=what)
    value = parse_size(memory) if isinstance(memory, str) else memory
    if value < 0:
        raise UsageError(f"{what} must be >= 0 bytes (got {value})", name=what, value=memory)
    return value


@dataclass(frozen=True, slots=True)
class LeaseAsk:
    """What a lease is asked for (the API's :class:`~roomkeeper.api.models.LeaseIn`).

    Attributes:
        memory: bytes, or a size such as ``600M``; the guard's estimate when None.
        ttl: seconds it lives without a heartbeat.
        owner: who holds it.
        release: a loopback URL called (DELETE) when it ends.
        relieve: a loopback URL called (POST) to ask the holder to end its turn now.
        session: the agent session it belongs to.
        disk: bytes, or a size, of disk it is expected to take.
        kind: what sort of work it is: the memory it gives back when it ends teaches the
            kind's size, and a lease of the kind asking no ``memory`` is reserved at it.
    """

    memory: int | str | None = None
    ttl: float = DEFAULT_TTL_S
    owner: str = "default"
    release: str | None = None
    relieve: str | None = None
    session: str | None = None
    disk: int | str | None = None
    kind: str | None = None

    def body(self, lease_id: str, wait_s: float) -> dict[str, Any]:
        """The grant's JSON body, checked by the API's own model before it is sent.

        Raises:
            UsageError: a value the gateway would refuse, said as the gateway says it.
        """
        raw = {
            "id": lease_id,
            "owner": self.owner,
            "memory_bytes": size_of(self.memory),
            "disk_bytes": size_of(self.disk, "disk"),
            "ttl_s": float(self.ttl),
            "wait_s": float(wait_s),
            "release": None if self.release is None else {"url": self.release},
            "relieve": None if self.relieve is None else {"url": self.relieve},
            "session": self.session,
            "kind": self.kind,
        }
        return checked(LeaseIn, raw)


def job_body(argv: list[str], options: Mapping[str, Any]) -> dict[str, Any]:
    """A job's JSON body (the API's :class:`~roomkeeper.api.models.JobIn`), checked first.

    Raises:
        UsageError: a value the gateway would refuse.
    """
    raw = dict(options)
    for name in ("memory_bytes", "disk_bytes"):
        if name in raw:
            raw[name] = size_of(raw[name], name)
    return checked(JobIn, {"argv": list(argv), **raw})


def checked(model: type[Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` validated by ``model``; the JSON of the fields that were given."""
    try:
        made = model.model_validate({k: v for k, v in raw.items() if v is not None})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or model.__name__
        raise UsageError(f"{where}: {first['msg']}", name=where) from None
    body: dict[str, Any] = made.model_dump(mode="json", exclude_unset=True)
    return body
