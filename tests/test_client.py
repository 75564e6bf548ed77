"""``roomkeeper.Client`` and ``AsyncClient`` against a real gateway: typed answers and errors,
leases that beat on their own and are released on exit, retries after ``Retry-After``, jobs
followed to their end, and a gateway on a Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from roomkeeper import AsyncClient, Client, ClientSettings
from roomkeeper.errors import GatewayUnavailable, NoRoom, NotFound, QueueFull, Unauthorized
from tests.gateways import (
    RunningGateway,
    free_port,
    gateway_env,
    running_gateway,
    stop_process,
    wait_until,
)


def client_of(gw: RunningGateway, **settings: object) -> Client:
    return Client(ClientSettings(url=gw.url, token=gw.token, **settings))  # type: ignore[arg-type]


def lease_state(gw: RunningGateway, lease_id: str) -> str:
    found = [v for v in gw.client.get("/v1/leases").json() if v["id"] == lease_id]
    return str(found[0]["state"]) if found else "absent"


def test_status_and_lease_calls_are_typed(module_gw: RunningGateway) -> None:
    """Answers come back as the API's own models: a status, a granted and a released lease."""
    with client_of(module_gw) as client:
        status = client.status()
        assert status.boot_id == module_gw.client.get("/health").json()["boot_id"]
        with client.lease("10M", ttl=30, owner="typed", session="s-1") as lease:
            assert lease.memory_bytes == 10 * 2**20
            assert client.status().sessions["s-1"].leases == 1
            assert lease_state(module_gw, lease.id) == "granted"
        assert lease_state(module_gw, lease.id) == "released"


def test_every_page_of_leases_is_followed(module_gw: RunningGateway) -> None:
    """A list longer than a page comes back whole: the client follows X-Next-Cursor."""
    with client_of(module_gw) as client:
        with client.lease("1M", ttl=30), client.lease("1M", ttl=30), client.lease("1M", ttl=30):
            ids_one_by_one = [lease.id for lease in client.leases(limit=1)]
        assert len(ids_one_by_one) == len(set(ids_one_by_one)) >= 3
        assert ids_one_by_one == [lease.id for lease in client.leases()]


def test_a_lease_beats_past_its_ttl_and_is_released_on_an_exception(
    module_gw: RunningGateway,
) -> None:
    """A 3 s lease held for 7 s is still granted (its thread beat); an exception in the
    block releases it.  (A shorter lease lost its grant on a busy machine: one stall of a
    second between beats a third of its time apart.)"""
    with client_of(module_gw) as client:
        with (
            pytest.raises(RuntimeError, match="the turn failed"),
            client.lease("5M", ttl=3) as lease,
        ):
            time.sleep(7)
            assert lease_state(module_gw, lease.id) == "granted"
            assert lease.lost is None
            raise RuntimeError("the turn failed")
        assert lease_state(module_gw, lease.id) == "released"


def test_errors_are_typed(module_gw: RunningGateway) -> None:
    """A wrong token, an unknown id, a lease with no room and a gateway that is not there
    each raise their own error, never a bare httpx one."""
    with Client(ClientSettings(url=module_gw.url, token="wrong")) as client:
        with pytest.raises(Unauthorized) as unauthorized:
            client.status()
        assert unauthorized.value.status == 401
    with client_of(module_gw) as client:
        with pytest.raises(NotFound, match="no-such-job"):
            client.job("no-such-job")
        with pytest.raises(NoRoom) as refused, client.lease(2**50, ttl=5, wait=0):
            pass
        assert refused.value.summary and refused.value.reason
    nobody = ClientSettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with Client(nobody, sleep=lambda s: None) as client, pytest.raises(GatewayUnavailable):
        client.status()


def test_a_429_is_retried_after_its_retry_after(tmp_path: Path) -> None:
    """A submission refused 429 (queue full, nothing queued) is sent again once its
    Retry-After has passed, and is queued when room came meanwhile."""
    with running_gateway(tmp_path, ROOMKEEPER_MAX_RUNNING="1", ROOMKEEPER_MAX_WAITING="1") as gw:
        waits: list[float] = []
        with client_of(gw) as plain:
            plain.submit(["sleep", "60"])
            waiting = plain.submit(["sleep", "60"])
            impatient = Client(ClientSettings(url=gw.url, token=gw.token), sleep=waits.append)
            with impatient, pytest.raises(QueueFull):
                impatient.submit(["true"])
            assert waits == [1.0] * 0 or min(waits) >= 1.0  # every wait was the Retry-After

            def free_then_sleep(seconds: float) -> None:
                waits.append(seconds)
                plain.cancel(waiting.id)  # room comes while the client waits
                time.sleep(seconds)

            waits.clear()
            patient = Client(ClientSettings(url=gw.url, token=gw.token), sleep=free_then_sleep)
            with patient:
                started = time.monotonic()
                made = patient.submit(["true"])
                assert time.monotonic() - started >= 1.0
                assert waits and waits[0] >= 1.0  # the gateway's Retry-After: 1
                assert patient.job(made.id).state.value in ("waiting", "running", "exited")
            for job in plain.jobs():
                if not job.state.final:
                    plain.cancel(job.id)


def test_jobs_submit_wait_stream_and_cancel(module_gw: RunningGateway) -> None:
    """A job's output streams until it ends and its end is waited for; a cancel stops one."""
    with client_of(module_gw) as client:
        job = client.submit(
            [
                sys.executable,
                "-c",
                "import time\nfor i in range(3): print(i, flush=True); time.sleep(0.3)",
            ]
        )
        streamed = b"".join(client.output(job.id, follow=True))
        assert streamed.split() == [b"0", b"1", b"2"]
        assert client.wait(job.id, timeout=30).exit_code == 0
        sleeper = client.submit(["sleep", "60"])
        client.cancel(sleeper.id)
        assert client.wait(sleeper.id, timeout=30).state.value in ("cancelled", "stopped")


def test_the_async_client_holds_and_releases_leases_and_runs_jobs(
    module_gw: RunningGateway,
) -> None:
    """AsyncClient: a lease beats past its ttl on its own task and is released on an
    exception; a job is submitted, streamed and waited for."""

    async def scenario() -> str:
        settings = ClientSettings(url=module_gw.url, token=module_gw.token)
        async with AsyncClient(settings) as client:
            assert (await client.status()).boot_id
            with contextlib.suppress(KeyError):
                async with client.lease("5M", ttl=3, session="async-s") as lease:
                    await asyncio.sleep(7)  # past twice its time: it beat
                    assert lease_state(module_gw, lease.id) == "granted"
                    assert (await client.status()).sessions["async-s"].leases == 1
                    raise KeyError("the turn failed")
            assert lease_state(module_gw, lease.id) == "released"
            job = await client.submit(["echo", "async hello"])
            out = b"".join([c async for c in client.output(job.id, follow=True)])
            assert (await client.wait(job.id, timeout=30)).exit_code == 0
            with pytest.raises(NotFound):
                await client.job("no-such-job")
            return out.decode()

    assert asyncio.run(scenario()).strip() == "async hello"


@contextlib.contextmanager
def socket_gateway(tmp: Path) -> Iterator[dict[str, str]]:
    """``roomkeeper gateway`` on a Unix socket; its environment; stopped whatever happens."""
    sock = tmp / "gw.sock"
    env = gateway_env(tmp)
    log = (tmp / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", "gateway", "--socket", str(sock)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def answers() -> bool:
            if not (Path(env["ROOMKEEPER_HOME"]) / "gateway.json").exists():
                return False
            with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(sock))
                return True
            return False

        wait_until(answers, "the socket gateway answering", timeout=90)
        yield {**env, "ROOMKEEPER_SOCKET_PATH": str(sock)}
    finally:
        stop_process(proc)
        log.close()


def test_a_gateway_on_a_socket(tmp_path: Path) -> None:
    """Found through ROOMKEEPER_HOME's gateway.json (proven by its boot id) or named by
    ROOMKEEPER_SOCKET, a gateway on a Unix socket grants and releases leases."""
    with socket_gateway(tmp_path) as env:
        home = {"ROOMKEEPER_HOME": env["ROOMKEEPER_HOME"]}
        with Client.from_env(home) as client:
            assert client.settings.socket == env["ROOMKEEPER_SOCKET_PATH"]
            with client.lease("1M", ttl=10) as lease:
                assert lease.id
        token = (Path(env["ROOMKEEPER_HOME"]) / "token").read_text().strip()
        named = {"ROOMKEEPER_SOCKET": env["ROOMKEEPER_SOCKET_PATH"], "ROOMKEEPER_TOKEN": token}
        with Client.from_env(named) as client:
            assert client.status().leases.granted == 0


def test_retries_stop_where_a_retry_is_unsafe() -> None:
    """A submission whose answer was lost is never sent again; a heartbeat is."""
    from roomkeeper.client.discovery import Retries
    from roomkeeper.client.wire import Call, next_wait_s

    lost = httpx.ReadTimeout("lost")
    retries = Retries()
    assert next_wait_s(Call("POST", "/v1/jobs"), 0, retries, error=lost) is None
    beat = Call("POST", "/v1/leases/x/heartbeat", idempotent=True)
    assert next_wait_s(beat, 0, retries, error=lost, rand=lambda: 1.0) == pytest.approx(0.2)
    assert next_wait_s(beat, retries.attempts - 1, retries, error=lost) is None


def test_a_lease_thread_is_gone_after_the_block(module_gw: RunningGateway) -> None:
    """No heartbeat thread outlives its ``with`` block."""
    with client_of(module_gw) as client, client.lease("1M", ttl=3) as lease:
        assert any(t.name == f"lease-{lease.id}" for t in threading.enumerate())
    assert not any(t.name == f"lease-{lease.id}" for t in threading.enumerate())
