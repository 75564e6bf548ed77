"""The examples for real: a gateway, the toy agent server and the dispatcher, each its own process.

Sessions that nobody deletes can hold 11 GB where 0.5 GB is enough.  With
release hooks the agent server gives every turn's session back and its RSS
returns to where it started; without them it grows by every session it built.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateways import gateway_env, running_gateway, stop_process

pytestmark = pytest.mark.kernel

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MIB = 2**20
TURNS = 50
SESSION_BYTES = 4 * MIB


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A real ``roomkeeper serve`` on a free port; yields its URL and the environment to use."""
    tmp = tmp_path_factory.mktemp("gateway")
    with running_gateway(tmp, supervised=True) as gw:
        yield gw.url, gateway_env(tmp)


@pytest.fixture
def agent() -> Iterator[str]:
    """A fresh toy agent server on a free port; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "agent_server.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first: list[str] = []
        reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=20)
        assert first and first[0].startswith("listening on "), f"agent server said {first!r}"
        yield f"http://127.0.0.1:{int(first[0].split()[-1])}"
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()


def stats(agent: str) -> dict[str, int]:
    """The agent server's ``GET /stats``."""
    response = httpx.get(f"{agent}/stats", timeout=10)
    response.raise_for_status()
    answer: dict[str, int] = response.json()
    return answer


def dispatch(gateway: tuple[str, dict[str, str]], agent: str, *extra: str) -> str:
    """Run the dispatcher for TURNS turns of SESSION_BYTES; returns its stdout."""
    url, env = gateway
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "dispatcher.py"),
            "--gateway",
            url,
            "--agent",
            agent,
            "--turns",
            str(TURNS),
            "--session-bytes",
            str(SESSION_BYTES),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_release_hooks_give_every_session_back(
    gateway: tuple[str, dict[str, str]], agent: str
) -> None:
    """After 50 leased turns with release hooks the agent server is back within 20 % of its RSS."""
    baseline = stats(agent)["rss_bytes"]
    out = dispatch(gateway, agent, "--id-prefix", "hooked-")
    after = stats(agent)
    assert abs(after["rss_bytes"] - baseline) <= 0.2 * baseline, (baseline, after, out)
    assert after["sessions"] == 0
    assert out.count("hook ok 204") == TURNS, out


def test_without_release_hooks_every_session_stays(
    gateway: tuple[str, dict[str, str]], agent: str
) -> None:
    """After 50 leased turns without release hooks the agent server holds every session's memory."""
    baseline = stats(agent)["rss_bytes"]
    out = dispatch(gateway, agent, "--id-prefix", "unhooked-", "--no-release-hook")
    after = stats(agent)
    assert after["rss_bytes"] - baseline >= 0.9 * TURNS * SESSION_BYTES, (baseline, after, out)
    assert after["sessions"] == TURNS
    assert out.count("hook none") == TURNS, out
