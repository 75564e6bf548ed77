"""Release hooks: a loopback HTTP call made when a lease or a job ends, as it is asked for.

A finished turn must give its session back: a lease or job may carry
``{"method": "DELETE", "url": "http://127.0.0.1:PORT/chat/<id>"}``.  It runs
when the lease or job ends, whatever the outcome: at least once, since the
call is saved as due before it is made and a restart makes a due call again,
each time with the same ``Idempotency-Key``.  Only loopback addresses are allowed:
roomkeeper never calls out of the machine.

This module is the hook as data (:class:`ReleaseHook`) and the check of a request's
``release`` object (:func:`parse_hook`); :mod:`roomkeeper.loopback.hook_calls` makes the
calls.  It imports no HTTP library until a hook is checked: a batch of local commands,
which never carries one, does not pay for loading httpx.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from roomkeeper.errors import UsageError

METHODS = frozenset({"DELETE", "POST", "PUT", "PATCH", "GET"})


HOOK_DUE = "due"  # a hook's outcome while the call is owed: saved before it is made


@dataclass(frozen=True, slots=True)
class ReleaseHook:
    """One loopback HTTP call.

    ``key`` travels as the ``Idempotency-Key`` header (``lease-<id>``, ``job-<id>``): a
    hook runs at least once, and after a crash mid-call it runs again with the same key,
    so a server can make the repeat harmless.
    """

    method: str
    url: str
    key: str | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, str]:
        """The hook as the API shows it."""
        return {"method": self.method, "url": self.url}


def is_loopback_host(host: str) -> bool:
    """``localhost`` or an address in 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_hook(value: Any) -> ReleaseHook:
    """Check a ``release`` object from a request.

    Raises:
        UsageError: not an object with a method and an http(s) loopback URL.
    """
    if not isinstance(value, dict) or set(value) - {"method", "url"} or "url" not in value:
        raise UsageError('release must be {"method": "DELETE", "url": "http://127.0.0.1:PORT/..."}')
    method = str(value.get("method", "DELETE")).upper()
    if method not in METHODS:
        raise UsageError(
            f"release.method must be one of {', '.join(sorted(METHODS))} (got {method!r})"
        )
    # Imported here, not above: a batch of local commands, which never carries a hook,
    # would otherwise load httpx at every start (the gateway loads it when it starts).
    import httpx

    try:
        url = httpx.URL(str(value["url"]))
    except (httpx.InvalidURL, TypeError, ValueError) as err:
        raise UsageError(f"release.url is not a URL: {err}") from err
    if url.scheme not in ("http", "https") or not is_loopback_host(url.host):
        raise UsageError(
            "release.url must be an http(s) URL on loopback (127.0.0.1, ::1 or localhost); "
            f"got host {url.host!r}"
        )
    return ReleaseHook(method, str(url))
