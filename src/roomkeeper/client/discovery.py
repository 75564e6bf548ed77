"""Where the gateway listens and its token, for a client.

``ROOMKEEPER_URL`` (an ``http://`` URL) or ``ROOMKEEPER_SOCKET`` (a Unix socket's path)
name the gateway; else the gateway that ``ROOMKEEPER_HOME/gateway.json`` records;
else ``http://127.0.0.1:8765``.  The token is ``ROOMKEEPER_TOKEN``, else the
``token`` file of ``ROOMKEEPER_HOME``.

A gateway found through ``gateway.json`` gets the token only once it is proven to
be that gateway: the recorded pid lives with the recorded start time, and the
unauthenticated ``/health`` answers the recorded boot id.  A local user who takes
the port while the gateway is down gets nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from roomkeeper.errors import NoGatewayError, UsageError
from roomkeeper.paths import home_dir

DEFAULT_URL = "http://127.0.0.1:8765"
SOCKET_BASE = "http://localhost"  # the gateway answers loopback names only
HOW = "start one with: roomkeeper serve"


@dataclass(frozen=True, slots=True)
class Retries:
    """When and how long a client waits before asking again.

    Attributes:
        attempts: tries in all, the first included (1: never again).
        base_s: the first backoff's ceiling; each later one doubles it.
        cap_s: the largest backoff.
        max_retry_after_s: the longest ``Retry-After`` honoured; a longer one is an error.
    """

    attempts: int = 5
    base_s: float = 0.2
    cap_s: float = 5.0
    max_retry_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How a client reaches the gateway.

    Attributes:
        url: the gateway's base URL (``http://localhost`` over a socket).
        token: the bearer token; None sends none.
        socket: a Unix socket's path to connect through, or None for TCP.
        timeout_s: each request's connect, read and write timeout; a grant that waits for
            room adds its wait to the read timeout.
        retries: the backoff of retried requests.
        checked_record: the ``gateway.json`` whose gateway must prove itself before the
            token is sent (None: the caller named the gateway).
    """

    url: str = DEFAULT_URL
    token: str | None = None
    socket: str | None = None
    timeout_s: float = 30.0
    retries: Retries = field(default_factory=Retries)
    checked_record: str | None = None


def settings_from_env(env: Mapping[str, str] | None = None) -> ClientSettings:
    """The settings the environment gives (see the module docstring); reads files, no network.

    Raises:
        UsageError: ROOMKEEPER_URL is not an http(s) URL.
    """
    env = os.environ if env is None else env
    home = home_dir(env, create=False)
    token = env.get("ROOMKEEPER_TOKEN") or _read_token(home)
    if env.get("ROOMKEEPER_URL"):
        url = env["ROOMKEEPER_URL"].rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UsageError(
                f"ROOMKEEPER_URL must be an http:// or https:// URL (got {url!r})",
                name="ROOMKEEPER_URL",
                value=url,
            )
        return ClientSettings(url=url, token=token)
    if env.get("ROOMKEEPER_SOCKET"):
        return ClientSettings(url=SOCKET_BASE, token=token, socket=env["ROOMKEEPER_SOCKET"])
    try:
        info: dict[str, Any] = json.loads((home / "gateway.json").read_text())
    except (OSError, ValueError):
        return ClientSettings(token=token)
    record = str(home / "gateway.json")
    if info.get("socket"):
        return ClientSettings(
            url=SOCKET_BASE, token=token, socket=str(info["socket"]), checked_record=record
        )
    url = f"http://127.0.0.1:{info.get('port')}"
    return ClientSettings(url=url, token=token, checked_record=record)


def _read_token(home: Path) -> str | None:
    try:
        return (home / "token").read_text().strip() or None
    except OSError:
        return None


def check_it_is_ours(client: httpx.Client, record: Path, how: str = HOW) -> None:
    """The gateway ``record`` (a ``gateway.json``) names lives and answers with its boot id;
    else refuse, before any token is sent.

    Raises:
        NoGatewayError: the recorded gateway is gone, or something else listens where it did.
    """
    try:
        info: dict[str, Any] = json.loads(record.read_text())
    except (OSError, ValueError):
        raise NoGatewayError(f"no roomkeeper gateway is recorded in {record}; {how}") from None
    if not _recorded_process_lives(info):
        raise NoGatewayError(f"the roomkeeper gateway recorded in {record} is not running; {how}")
    try:
        answer = client.get("/health", timeout=5)
        answer.raise_for_status()
        boot_id = answer.json().get("boot_id")
    except (httpx.HTTPError, ValueError, AttributeError):
        raise NoGatewayError(
            f"the roomkeeper gateway recorded in {record} does not answer; {how}"
        ) from None
    if boot_id != info.get("boot_id"):
        raise NoGatewayError(
            f"what answers where {record} says the gateway listens is not that gateway "
            f"(boot id {boot_id!r}, recorded {info.get('boot_id')!r}); the token was not "
            f"sent; {how}"
        )


def _recorded_process_lives(info: dict[str, Any]) -> bool:
    """The recorded pid exists and started when the record says (a reused pid does not)."""
    try:
        process = psutil.Process(int(info["pid"]))
        started = float(info["started"])
    except (KeyError, TypeError, ValueError, psutil.Error):
        return False
    try:
        return abs(process.create_time() - started) < 0.01
    except psutil.Error:
        return False
