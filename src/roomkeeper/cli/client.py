"""The CLI's way to a running gateway: where it listens and its token, from ROOMKEEPER_HOME."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import httpx

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
    client = httpx.Client(
        base_url=base,
        transport=transport,
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    )
    try:
        client.get("/health", timeout=5).raise_for_status()
    except httpx.HTTPError:
        client.close()
        raise NoGatewayError(
            f"the roomkeeper gateway recorded in {home / 'gateway.json'} does not answer; {how}"
        ) from None
    return client
