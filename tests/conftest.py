"""Fixtures shared by the test modules.

- ``gw``: a real gateway on a free loopback port for one test; ``module_gw``
  one for a whole module (tests that only read or add their own records).
- ``reaper``: every process tree and job group a test launched, killed and
  removed whatever the test's outcome.
- every test, after it ends: the job groups of gateways it SIGKILLed and did not
  start again are removed.
- ``tiny_disk``: a real 2 MiB tmpfs, to fill (``gateways.fill_disk``) as a full disk.
- ``browser``: headless Debian chromium, or a skip that names what is missing.

Helpers that are not fixtures live in their own modules beside this one
(``gateways``, ``supervisors``, ``processes``, ``fakes``, ``kernel_files``,
``cgroups``, ``batch_cli``, ``pages``, ``worktree_repos``, ``ray_cluster``); no
test module imports from another (tests/test_layers.py holds it).
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateways import RunningGateway, remove_groups_left_by_kills, running_gateway
from tests.hook_servers import SlowHooks
from tests.pages import CHROMIUM, CHROMIUM_ARGS
from tests.processes import Reaper


@pytest.fixture(autouse=True)
def _no_job_groups_left_by_kills() -> Iterator[None]:
    """A test that SIGKILLs a gateway and starts none after it leaves that gateway's job
    groups behind (the next start would remove them): they are removed when it ends."""
    yield
    left = remove_groups_left_by_kills()
    assert not left, f"job groups of killed gateways that could not be removed: {left}"


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[RunningGateway]:
    """A real gateway (no supervisor) for this test alone."""
    with running_gateway(tmp_path) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def module_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """A real gateway (no supervisor) shared by the tests of one module."""
    with running_gateway(tmp_path_factory.mktemp("gw")) as gateway:
        yield gateway


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Closes every job, kills every watched pid and removes every cgroup a test made."""
    keeper = Reaper()
    try:
        yield keeper
    finally:
        keeper.cleanup()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs, mounted for the test and always unmounted."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=False
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and the mount syscall)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless Debian chromium, or a skip that names what is missing."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)")
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("playwright is not importable (pip install 'playwright>=1.40')")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def hooks() -> Iterator[SlowHooks]:
    """A loopback server that records the release hooks it is sent, shut down after the test."""
    server = SlowHooks()
    yield server
    server.server.shutdown()
    server.server.server_close()
