"""The CLI's way to a running gateway: where it listens and its token, from ROOMKEEPER_HOME.

The token goes only to the gateway ``gateway.json`` records: before it is
sent, the recorded pid must be alive with the recorded start time, and the
unauthenticated ``/health`` must answer the recorded boot id.  A local user
who takes the port while the gateway is down (a backoff, the restart
cooldown, after a crash) gets nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import httpx

from roomkeeper.client.discovery import check_it_is_ours
from roomkeeper.errors import NoGatewayError
from roomkeeper.paths import home_dir


def connect(env: Mapping[str, str] | None = None, *, timeout: float = 30.0) -> httpx.Client:
    """An httpx client for the gateway of ROOMKEEPER_HOME, with its token.

    Raises:
        NoGatewayError: none is running; the message says how to start one.
    """
    env = os.environ if env is None else env
    home = home_dir(env, create=False)
    how = "start one with: roomkeeper serve"
    try:
        info: dict[str, Any] = json.loads((home / "gateway.json").read_text())
        token = (home / "token").read_text().strip()
    except (OSError, ValueError):
        raise NoGatewayError(f"no roomkeeper gateway is running for {home}; {how}") from None
    if info.get("socket"):
        transport = httpx.HTTPTransport(uds=info["socket"])
        base = "http://localhost"  # the gateway answers loopback names only
    else:
        transport = httpx.HTTPTransport()
        base = f"http://127.0.0.1:{info.get('port')}"
    client = httpx.Client(base_url=base, transport=transport, timeout=timeout)
    try:
        check_it_is_ours(client, home / "gateway.json", how)
    except BaseException:
        client.close()
        raise
    client.headers["Authorization"] = f"Bearer {token}"
    return client
