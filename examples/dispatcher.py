"""A tiny dispatcher: a lease before every turn, and the lease back after it.

It talks to the gateway through the Python client, :class:`roomkeeper.Client`:
``client.lease(...)`` waits for room, heartbeats on its own thread while the
turn runs, and gives the lease back when the turn ends, exceptions included.
For each turn ``t-<n>`` it

1. asks the roomkeeper gateway for a lease the size of one session
   (``client.lease``, under the turn's own id), with a release hook that deletes the turn's session
   on the agent server (``DELETE {agent}/chat/t-<n>``) and a relieve hook
   that asks this dispatcher to end the turn now (``POST
   {dispatcher}/relieve/t-<n>``, served by the dispatcher itself);
2. runs the turn on the agent server (``POST {agent}/chat/t-<n>``), whose
   session may grow while the turn runs (``--grow-bytes``, ``--turn-s``);
3. gives the lease back as the ``with`` block ends; the gateway runs the
   release hook before it answers, so the session is gone when the lease is.

Under sustained memory pressure the gateway may call a turn's relieve hook:
the dispatcher then ends that turn on the agent server (``POST
{agent}/chat/t-<n>/end``, which drops its session) and gives the lease back;
the gateway reports that lease ``relieved``.

A refusal (no room within ``--wait``) stops launching turns: the container has no room, and the
next turn would only ask again.  ``--no-release-hook`` leaves the release
hook out, which is the bug release hooks exist for: every finished turn's
session stays in the agent server and its memory grows with every turn.
``--no-relieve-hook`` leaves the relieve hook out: the gateway can then not
end a turn that outgrows its lease.

Usage::

    python examples/dispatcher.py --gateway http://127.0.0.1:PORT \\
        --agent http://127.0.0.1:APORT --turns 50 [--concurrency K] [--stagger S] \\
        [--session-bytes N] [--grow-bytes G --turn-s T] [--no-release-hook] \\
        [--no-relieve-hook] [--id-prefix P] [--token T]

The token is ``--token``, else the file ``$ROOMKEEPER_HOME/token``.  Exit
codes: 0 every turn ran (a relieved turn counts as run), 2 a lease was
refused, 1 anything else went wrong.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from roomkeeper import Client, ClientSettings
from roomkeeper.errors import GatewayError, NoRoom

MIB = 2**20


def read_token(given: str | None) -> str:
    """``--token``, else ``$ROOMKEEPER_HOME/token`` (as the client finds it)."""
    if given:
        return given
    with Client.from_env() as found:  # no I/O: the token file the client would read
        token = found.settings.token
    if not token:
        raise SystemExit("dispatcher: no --token and no token in $ROOMKEEPER_HOME/token")
    return token


def mib(n: int) -> str:
    """Bytes in MiB, for people."""
    return f"{n / MIB:.1f} MiB"


def detail(response: httpx.Response) -> str:
    """What an unexpected answer said, in one line."""
    return f"HTTP {response.status_code} {response.text.strip()[:200]}"


class RefusedError(Exception):
    """The gateway said no room; the message is its reason and summary."""


class DispatchError(Exception):
    """Something answered what the dispatcher did not expect."""


RELIEVE = re.compile(r"^/relieve/([A-Za-z0-9._:-]{1,200})$")


class Dispatcher:
    """One gateway, one agent server, one token; serves its own relieve route."""

    def __init__(self, gateway: str, agent: str, token: str, *, timeout: float = 30.0) -> None:
        self.agent_url = agent.rstrip("/")
        self.gateway = Client(ClientSettings(url=gateway.rstrip("/"), token=token))
        self.agent = httpx.Client(base_url=self.agent_url, timeout=timeout)
        self.relieved: list[str] = []  # turns the gateway asked us to end, in order
        self._said = threading.Lock()
        self._server = self._relieve_server()
        self.relieve_url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _relieve_server(self) -> ThreadingHTTPServer:
        """``POST /relieve/{turn}`` on a free loopback port: the gateway's relieve hook."""
        dispatcher = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the dispatcher prints what happened."""

            def do_POST(self) -> None:
                match = RELIEVE.match(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                status, body = (
                    (HTTPStatus.NOT_FOUND, {"error": "no such route"})
                    if match is None
                    else dispatcher.relieve(match.group(1))
                )
                data = json.dumps(body).encode() + b"\n"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="relieve", daemon=True).start()
        return server

    def relieve(self, turn: str) -> tuple[int, dict[str, Any]]:
        """The gateway asks us to end ``turn`` now: end it on the agent server, which drops
        its session; the turn's own thread then gives the lease back."""
        try:
            response = self.agent.post(f"/chat/{turn}/end")
        except httpx.HTTPError as err:
            return HTTPStatus.BAD_GATEWAY, {"error": f"the agent server did not answer: {err}"}
        if response.status_code == 404:
            return HTTPStatus.NOT_FOUND, {"error": f"turn {turn} is not running"}
        if response.status_code != 200:
            return HTTPStatus.BAD_GATEWAY, {"error": f"the agent server said {detail(response)}"}
        freed = int(response.json().get("freed_bytes", 0))
        with self._said:
            self.relieved.append(turn)
            print(f"{turn}: relieve asked by roomkeeper, turn ended ({mib(freed)} freed)")
        return HTTPStatus.OK, {"turn": turn, "ended": True, "freed_bytes": freed}

    def close(self) -> None:
        """Stop the relieve route; close both connections."""
        self._server.shutdown()
        self._server.server_close()
        self.gateway.close()
        self.agent.close()

    def run_turn(
        self, turn: str, session_bytes: int, grow_bytes: int, turn_s: float
    ) -> dict[str, Any]:
        """``POST {agent}/chat/{turn}``: the agent server runs the turn; its answer at the end."""
        body = {"session_bytes": session_bytes, "grow_bytes": grow_bytes, "turn_s": turn_s}
        response = self.agent.post(f"/chat/{turn}", json=body, timeout=turn_s + 30.0)
        if response.status_code not in (200, 201):
            raise DispatchError(f"turn {turn}: {detail(response)}")
        started: dict[str, Any] = response.json()
        return started

    def stats(self) -> dict[str, Any]:
        """The agent server's ``GET /stats``."""
        response = self.agent.get("/stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats


def one_turn(d: Dispatcher, args: argparse.Namespace, turn: str) -> None:
    """Lease, run and give back one turn, and say how it went (raises RefusedError)."""
    hooks: dict[str, str] = {}
    if not args.no_release_hook:
        hooks["release"] = f"{d.agent_url}/chat/{turn}"
    if not args.no_relieve_hook:
        hooks["relieve"] = f"{d.relieve_url}/relieve/{turn}"
    try:
        # The lease heartbeats while the turn runs, and is given back however it ends.
        with d.gateway.lease(
            args.session_bytes,
            ttl=args.ttl,
            wait=args.wait,
            lease_id=turn,
            owner="dispatcher",
            **hooks,
        ) as lease:
            ran = d.run_turn(turn, args.session_bytes, args.grow_bytes, args.turn_s)
    except NoRoom as err:
        raise RefusedError(f"{err.reason}: {err.summary}") from err
    ended = lease.released or lease.info  # None: it had ended already (its ttl)
    print(
        f"{turn}: granted {mib(args.session_bytes)}, turn {ran.get('ended')} "
        f"(session {mib(ran.get('session_bytes', 0))}, sessions held: {ran.get('sessions')}), "
        f"lease {ended.state.value}, hook {ended.hook_outcome or 'none'}",
        flush=True,
    )


def run(args: argparse.Namespace) -> int:
    """Dispatch ``args.turns`` turns, ``args.concurrency`` at once; returns the exit code."""
    d = Dispatcher(args.gateway, args.agent, read_token(args.token))
    done = 0
    code = 0
    refused = threading.Event()
    try:
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            running: dict[concurrent.futures.Future[None], str] = {}
            for n in range(args.turns):
                if refused.is_set():
                    break
                turn = f"{args.id_prefix}{n}"
                running[pool.submit(one_turn, d, args, turn)] = turn
                if args.stagger > 0 and n + 1 < args.turns:
                    time.sleep(args.stagger)
                # At most `concurrency` turns in flight: wait for one before the next.
                while len([f for f in running if not f.done()]) >= args.concurrency:
                    concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in [f for f in running if f.done()]:
                    done += _settle(future, running.pop(future), refused)
            for future in concurrent.futures.as_completed(list(running)):
                done += _settle(future, running[future], refused)
        code = 2 if refused.is_set() else 0
        stats = d.stats()
    except (DispatchError, GatewayError) as err:
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
        f"done: {done} of {args.turns} turns ({len(d.relieved)} relieved); agent server: "
        f"sessions {stats['sessions']}, rss {mib(stats['rss_bytes'])}",
        flush=True,
    )
    return code


def _settle(future: concurrent.futures.Future[None], turn: str, refused: threading.Event) -> int:
    """1 for a turn that ran; a refusal is said and stops new turns; other errors propagate."""
    try:
        future.result()
    except RefusedError as err:
        print(f"{turn}: refused, stopping: {err}", flush=True)
        refused.set()
        return 0
    return 1


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gateway", required=True, help="roomkeeper gateway, http://127.0.0.1:PORT")
    p.add_argument("--agent", required=True, help="agent server, http://127.0.0.1:PORT")
    p.add_argument("--turns", type=int, default=50, help="how many turns (default 50)")
    p.add_argument("--concurrency", type=int, default=1, help="turns running at once (default 1)")
    p.add_argument(
        "--stagger", type=float, default=0.0, help="seconds between starting turns (default 0)"
    )
    p.add_argument(
        "--session-bytes",
        type=int,
        default=8 * MIB,
        help="one session's size at the start of its turn, and its lease (default 8 MiB)",
    )
    p.add_argument(
        "--grow-bytes", type=int, default=0, help="how much a session grows during its turn"
    )
    p.add_argument(
        "--turn-s", type=float, default=0.0, help="how long a turn runs, in seconds (default 0)"
    )
    p.add_argument(
        "--no-release-hook",
        action="store_true",
        help="take leases without a release hook: sessions are never deleted (the bug)",
    )
    p.add_argument(
        "--no-relieve-hook",
        action="store_true",
        help="take leases without a relieve hook: the gateway cannot end a turn under pressure",
    )
    p.add_argument(
        "--token",
        help="the gateway's token (default: $ROOMKEEPER_HOME/token); give it as --token=TOKEN, "
        "since a token may begin with '-'",
    )
    p.add_argument("--id-prefix", default="t-", help="turn ids are PREFIX<n> (default t-)")
    p.add_argument("--ttl", type=float, default=60.0, help="lease ttl in seconds (default 60)")
    p.add_argument(
        "--wait", type=float, default=5.0, help="seconds the gateway may wait for room (default 5)"
    )
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.turns < 0 or args.session_bytes < 0 or args.grow_bytes < 0:
        p.error("--concurrency must be >= 1; --turns, --session-bytes, --grow-bytes >= 0")
    if not 0 <= args.turn_s <= 3600:
        p.error(f"--turn-s must be from 0 to 3600 (got {args.turn_s})")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
