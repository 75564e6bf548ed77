"""Release hooks: a loopback HTTP call made when a lease or a job ends (seed 000's second commit).

A finished turn must give its session back: a lease or job may carry
``{"method": "DELETE", "url": "http://127.0.0.1:PORT/chat/<id>"}``.  It runs
once when the lease or job ends, whatever the outcome, with a short
timeout; its failure is recorded and never retried forever.  Only loopback
addresses are allowed: roomkeeper never calls out of the machine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import httpx

from roomkeeper.errors import UsageError

HOOK_TIMEOUT_S = 3.0
METHODS = frozenset({"DELETE", "POST", "PUT", "PATCH", "GET"})


@dataclass(frozen=True, slots=True)
class ReleaseHook:
    """One loopback HTTP call."""

    method: str
    url: str

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


def run_hook(hook: ReleaseHook, *, timeout: float = HOOK_TIMEOUT_S) -> str:
    """Make the call once; return its outcome in words (``ok 204`` or ``failed: ...``)."""
    try:
        response = httpx.request(hook.method, hook.url, timeout=timeout)
    except httpx.HTTPError as err:
        return f"failed: {type(err).__name__}"
    if response.is_success:
        return f"ok {response.status_code}"
    return f"failed: HTTP {response.status_code}"
