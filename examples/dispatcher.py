"""A tiny dispatcher: a lease before every turn, and the lease back after it.

For each turn ``t-<n>`` it

1. asks the roomkeeper gateway for a lease the size of one session
   (``POST /v1/leases``), with a release hook that deletes the turn's session
   on the agent server (``DELETE {agent}/chat/t-<n>``);
2. starts the turn on the agent server (``POST {agent}/chat/t-<n>``);
3. gives the lease back (``DELETE /v1/leases/t-<n>``); the gateway runs the
   hook before it answers, so the session is gone when the lease is.

A refusal (409) stops the run: the container has no room, and the next turn
would only ask again.  ``--no-release-hook`` leaves the hook out, which is
the bug release hooks exist for: every finished turn's session stays in
the agent server and its memory grows with every turn.

Usage::

    python examples/dispatcher.py --gateway http://127.0.0.1:PORT \\
        --agent http://127.0.0.1:APORT --turns 50 [--no-release-hook] [--session-bytes N]

The token is ``--token``, else the file ``$ROOMKEEPER_HOME/token``.  Exit
codes: 0 every turn ran, 2 a lease was refused, 1 anything else went wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import httpx

MIB = 2**20


def home_dir() -> Path:
    """ROOMKEEPER_HOME, found the way roomkeeper finds it."""
    if os.environ.get("ROOMKEEPER_HOME"):
        return Path(os.environ["ROOMKEEPER_HOME"]).expanduser()
    if os.environ.get("XDG_STATE_HOME"):
        return Path(os.environ["XDG_STATE_HOME"]).expanduser() / "roomkeeper"
    return Path.home() / ".local/state/roomkeeper"


def read_token(given: str | None) -> str:
    """``--token``, else ``$ROOMKEEPER_HOME/token``."""
    if given:
        return given
    path = home_dir() / "token"
    try:
        return path.read_text().strip()
    except OSError as err:
        raise SystemExit(f"dispatcher: no --token and cannot read {path}: {err}") from err


def mib(n: int) -> str:
    """Bytes in MiB, for people."""
    return f"{n / MIB:.1f} MiB"


def detail(response: httpx.Response) -> str:
    """What an unexpected answer said, in one line."""
    return f"HTTP {response.status_code} {response.text.strip()[:200]}"


class RefusedError(Exception):
    """The gateway said no room (409); the message is its summary."""


class DispatchError(Exception):
    """Something answered what the dispatcher did not expect."""


class Dispatcher:
    """One gateway, one agent server, one token."""

    def __init__(self, gateway: str, agent: str, token: str, *, timeout: float = 30.0) -> None:
        self.agent_url = agent.rstrip("/")
        self.gateway = httpx.Client(
            base_url=gateway.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )
        self.agent = httpx.Client(base_url=self.agent_url, timeout=timeout)

    def close(self) -> None:
        """Close both connections."""
        self.gateway.close()
        self.agent.close()

    def take_lease(
        self, turn: str, session_bytes: int, *, hook: bool, ttl_s: float, wait_s: float
    ) -> dict[str, Any]:
        """``POST /v1/leases``; the granted lease, or :class:`RefusedError`."""
        body: dict[str, Any] = {
            "id": turn,
            "owner": "dispatcher",
            "memory_bytes": session_bytes,
            "ttl_s": ttl_s,
            "wait_s": wait_s,
        }
        if hook:
            body["release"] = {"method": "DELETE", "url": f"{self.agent_url}/chat/{turn}"}
        # The gateway may hold the request up to wait_s looking for room.
        response = self.gateway.post("/v1/leases", json=body, timeout=wait_s + 30.0)
        if response.status_code in (200, 201):  # 200: a retried id that is still granted
            lease: dict[str, Any] = response.json()
            return lease
        if response.status_code == 409:
            answer = response.json()
            raise RefusedError(f"{answer.get('reason')}: {answer.get('summary')}")
        raise DispatchError(f"lease {turn}: {detail(response)}")

    def start_turn(self, turn: str, session_bytes: int) -> dict[str, Any]:
        """``POST {agent}/chat/{turn}``: the agent server builds the turn's session."""
        response = self.agent.post(f"/chat/{turn}", json={"session_bytes": session_bytes})
        if response.status_code not in (200, 201):
            raise DispatchError(f"turn {turn}: {detail(response)}")
        started: dict[str, Any] = response.json()
        return started

    def give_back(self, turn: str) -> dict[str, Any]:
        """``DELETE /v1/leases/{turn}``; the gateway runs the release hook before it answers."""
        response = self.gateway.delete(f"/v1/leases/{turn}")
        if response.status_code != 200:
            raise DispatchError(f"release {turn}: {detail(response)}")
        released: dict[str, Any] = response.json()
        return released

    def stats(self) -> dict[str, Any]:
        """The agent server's ``GET /stats``."""
        response = self.agent.get("/stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats


def run(args: argparse.Namespace) -> int:
    """Dispatch ``args.turns`` turns; returns the exit code."""
    d = Dispatcher(args.gateway, args.agent, read_token(args.token))
    done = 0
    code = 0
    try:
        for n in range(args.turns):
            turn = f"{args.id_prefix}{n}"
            try:
                d.take_lease(
                    turn,
                    args.session_bytes,
                    hook=not args.no_release_hook,
                    ttl_s=args.ttl,
                    wait_s=args.wait,
                )
            except RefusedError as err:
                print(f"{turn}: refused, stopping: {err}", flush=True)
                code = 2
                break
            try:
                started = d.start_turn(turn, args.session_bytes)
            finally:  # a turn that failed to start still gives its lease back
                released = d.give_back(turn)
            done += 1
            print(
                f"{turn}: granted {mib(args.session_bytes)}, turn started "
                f"(sessions held: {started.get('sessions')}), lease {released.get('state')}, "
                f"hook {released.get('hook_outcome') or 'none'}",
                flush=True,
            )
        stats = d.stats()
    except DispatchError as err:
        print(f"dispatcher: {err}", file=sys.stderr, flush=True)
        return 1
    except httpx.HTTPError as err:
        where = (
            err.request.url if isinstance(err, httpx.RequestError | httpx.HTTPStatusError) else ""
        )
        print(f"dispatcher: {where}: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        d.close()
    print(
        f"done: {done} of {args.turns} turns; agent server: sessions {stats['sessions']}, "
        f"rss {mib(stats['rss_bytes'])}",
        flush=True,
    )
    return code


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gateway", required=True, help="roomkeeper gateway, http://127.0.0.1:PORT")
    p.add_argument("--agent", required=True, help="agent server, http://127.0.0.1:PORT")
    p.add_argument("--turns", type=int, default=50, help="how many turns (default 50)")
    p.add_argument(
        "--session-bytes", type=int, default=8 * MIB, help="one session's size (default 8 MiB)"
    )
    p.add_argument(
        "--no-release-hook",
        action="store_true",
        help="take leases without a release hook: sessions are never deleted (the bug)",
    )
    p.add_argument("--token", help="the gateway's token (default: $ROOMKEEPER_HOME/token)")
    p.add_argument("--id-prefix", default="t-", help="turn ids are PREFIX<n> (default t-)")
    p.add_argument("--ttl", type=float, default=60.0, help="lease ttl in seconds (default 60)")
    p.add_argument(
        "--wait", type=float, default=5.0, help="seconds the gateway may wait for room (default 5)"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
