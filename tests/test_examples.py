"""The examples for real: a gateway, the toy agent server and the dispatcher, each its own process.

Sessions that nobody deletes can hold 11 GB where 0.5 GB is enough.  With
release hooks the agent server gives every turn's session back and its RSS
returns to where it started; without them it grows by every session it built,
and a gateway in the same memory group says ``memory not given back``.
Sessions that outgrow their leases are relieved through the dispatcher's
relieve hook, newest first, before the kernel kills anything.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cgroups import MemoryBox, memory_box
from tests.gateways import gateway_env, gateway_in_box, running_gateway, stop_process, wait_until
from tests.pages import PAGE_TIMEOUT_MS

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
    with agent_server() as url:
        yield url


@contextlib.contextmanager
def agent_server(box: MemoryBox | None = None) -> Iterator[str]:
    """A toy agent server on a free port (inside ``box`` when given); yields its URL."""
    command = [sys.executable, str(EXAMPLES / "agent_server.py")]
    proc = subprocess.Popen(
        box.argv(command, leaf="agent") if box is not None else command,
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


# ------------------------------------------------- in a real memory group

BOX_LIMIT = 1_000_000_000  # line 0.90 GB (no gateway reserve), stop line 0.975 GB
MB = 10**6


def dispatch_in(
    box: MemoryBox, client: httpx.Client, agent: str, *args: str, timeout: float = 180
) -> str:
    """Run the dispatcher inside ``box`` against the gateway of ``client``; its stdout."""
    token = client.headers["Authorization"].removeprefix("Bearer ")
    command = [
        sys.executable,
        str(EXAMPLES / "dispatcher.py"),
        "--gateway",
        str(client.base_url),
        "--agent",
        agent,
        f"--token={token}",  # a token may begin with "-": never a separate argument
        *args,
    ]
    result = subprocess.run(
        box.argv(command, leaf="dispatcher"),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_sessions_that_outgrow_their_leases_are_relieved_newest_first(tmp_path: Path) -> None:
    """Three turns leased at 100 MB grow to 420 MB each in a 1 GB group: the gateway relieves
    the newest through the dispatcher's relieve hook, the oldest finishes, nothing is killed.

    Together they grow 40 MB/s, so the quarter headroom between the stop line and the limit
    (25 MB) lasts about 0.6 s: time for the hook's round trip on an emulated kernel too."""
    with memory_box(BOX_LIMIT) as box:
        oom_before = box.oom_kills()
        with gateway_in_box(box, tmp_path) as (client, log_path), agent_server(box) as agent:
            out = dispatch_in(
                box,
                client,
                agent,
                *("--turns", "3", "--concurrency", "3", "--stagger", "0.5"),
                *("--session-bytes", str(100 * MB), "--grow-bytes", str(320 * MB)),
                *("--turn-s", "24", "--id-prefix", "grow-"),
            )
            leases = {v["id"]: v for v in client.get("/v1/leases").json()}
            status = client.get("/v1/status").json()
            log = log_path.read_text()
        assert box.oom_kills() == oom_before, out + log
    asked = re.findall(r"^(grow-\d): relieve asked by roomkeeper", out, flags=re.M)
    assert asked, out + log
    # Newest first: each relief took the newest lease still running, so the relieved turns
    # are the last granted, asked for in order from the newest down.  Newest is by grant:
    # on an emulated kernel a turn asked for 0.5 s later was once granted first.
    by_grant = sorted(leases, key=lambda turn: leases[turn]["granted_at"], reverse=True)
    assert asked == by_grant[: len(asked)], (out, {t: leases[t]["granted_at"] for t in leases})
    oldest = by_grant[-1]
    assert f"{oldest}: granted" in out and "turn finished" in out.split(f"{oldest}: granted")[1]
    for turn in asked:
        assert leases[turn]["state"] == "relieved", leases[turn]
        assert leases[turn]["relieve_outcome"].startswith("relieved: used fell"), leases[turn]
    assert leases[oldest]["state"] == "released"
    assert status["pressure"]["relieved"] == len(asked), status["pressure"]
    assert "asked to end its turn (its relieve hook)" in log


def needs_you_headline(client: httpx.Client) -> str:
    return str(client.get("/v1/needs-you").json()["headline"])


@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_memory_not_given_back_is_said_without_release_hooks_and_never_with_them(
    tmp_path: Path,
) -> None:
    """20 turns that give their sessions back never raise the headline; 20 that do not raise
    it, with the agent server named among the processes that grew."""
    with (
        memory_box(BOX_LIMIT) as box,
        gateway_in_box(box, tmp_path) as (client, _),
        agent_server(box) as agent,
    ):
        said: list[str] = []
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    said.append(needs_you_headline(client))
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            turns = ("--turns", "20", "--session-bytes", str(24 * MB), "--turn-s", "0.2")
            dispatch_in(box, client, agent, *turns, "--id-prefix", "hooked-")
            time.sleep(3)  # the records after the last endings, and a quiet moment
        finally:
            watching.set()
            watcher.join(timeout=10)
        assert said and "memory not given back" not in said, set(said)
        dispatch_in(box, client, agent, *turns, "--id-prefix", "leak-", "--no-release-hook")
        wait_until(
            lambda: needs_you_headline(client) == "memory not given back",
            "the memory not given back headline",
            timeout=10,
        )
        baseline = client.get("/v1/status").json()["baseline"]
        metrics = client.get("/metrics").text
        history = client.get("/v1/history").json()
    assert baseline["not_given_back"] is True
    assert baseline["leases_ended_without_hook"] == 20
    assert baseline["baseline_bytes"] - baseline["then_bytes"] > 0.1 * 0.9 * BOX_LIMIT
    # The agent server holds the 20 sessions: it leads the processes that grew.
    assert baseline["grew"][0]["bytes"] >= 18 * 24 * MB, baseline["grew"]
    assert "roomkeeper_memory_not_given_back 1.0" in metrics
    fired = [e for e in history if e["code"] == "memory_not_given_back"]
    assert len(fired) == 1, history
    assert fired[0]["numbers"]["endings"] >= 10, fired


# The chart's baseline label, in GB, or null before it is drawn.
BASELINE_LABEL = """() => {
    const label = [...document.querySelectorAll('#chart text.label-baseline')][0];
    const m = label && label.textContent.match(/baseline ([0-9.]+) GB/);
    return m ? Number(m[1]) : null;
}"""


def test_the_health_page_shows_the_baseline_rising_during_a_leak_run(
    browser: Any, tmp_path: Path
) -> None:
    """In chromium, while turns leave their sessions behind, the chart's baseline line rises
    beside used memory and the headline becomes ``memory not given back``."""
    with (
        memory_box(BOX_LIMIT) as box,
        gateway_in_box(box, tmp_path) as (client, _),
        agent_server(box) as agent,
    ):
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(f"{client.base_url}/")
        page.wait_for_function(f"() => ({BASELINE_LABEL})() !== null", timeout=PAGE_TIMEOUT_MS)
        before = page.evaluate(BASELINE_LABEL)
        leak = ("--turns", "20", "--session-bytes", str(16 * MB), "--turn-s", "0.5")
        run = threading.Thread(
            target=dispatch_in, args=(box, client, agent, *leak, "--no-release-hook")
        )
        run.start()
        seen = [before]
        while run.is_alive():  # the line rises while the run goes on, not only after it
            time.sleep(2)
            seen.append(page.evaluate(BASELINE_LABEL))
        run.join()
        page.wait_for_function(
            "() => document.querySelector('#headline').textContent === 'memory not given back'",
            timeout=PAGE_TIMEOUT_MS,
        )
        page.wait_for_function(
            f"() => ({BASELINE_LABEL})() >= {before + 0.25}", timeout=PAGE_TIMEOUT_MS
        )
        path = page.locator("#chart path.baseline").get_attribute("d") or ""
        page.screenshot(path=str(tmp_path / "health-leak.png"), full_page=True)
        assert errors == []
    rising = [b for a, b in itertools.pairwise(seen) if b > a]
    assert len(rising) >= 2, seen  # seen rising at least twice during the run
    assert path.count("L") >= 3, path
