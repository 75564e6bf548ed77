"""The Health page and needs-you say what holds admission now, for the job that waits next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from roomkeeper.api.views import feed_json
from roomkeeper.gateway.service import Gateway
from roomkeeper.jobs.spec import JobSpec
from roomkeeper.relief.baseline import BaselineRecord
from roomkeeper.relief.cooldown import CooldownCause
from tests.gateways import in_process_gateway

GB = 10**9


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A gateway wired in this process, never started: its answers are read directly."""
    with in_process_gateway(
        tmp_path,
        ROOMKEEPER_WORKSPACE=str(tmp_path / "no" / "such" / "workspace"),
        ROOMKEEPER_MEMORY_LIMIT_MB="100000",
    ) as built:
        yield built


def test_a_cooldown_is_the_headline_with_how_long_it_holds(gateway: Gateway) -> None:
    """Unset, a stop's cooldown lasts until its memory is back, at most 60 s; a person's
    ROOMKEEPER_PRESSURE_COOLDOWN holds that long, and the words say which."""
    gateway.scheduler.cooldown.start(60, CooldownCause.PRESSURE)
    said = gateway.headlines.needs_you()
    assert said["headline"] == "admission held after pressure"
    assert "until its memory is back" in said["body"]
    assert "at most 60 s more" in said["body"] or "at most 59 s more" in said["body"]
    gateway.env["ROOMKEEPER_PRESSURE_COOLDOWN"] = "60"
    fixed = gateway.headlines.needs_you()["body"]
    assert "held 60 s more" in fixed or "held 59 s more" in fixed
    assert "ROOMKEEPER_PRESSURE_COOLDOWN" in fixed
    del gateway.env["ROOMKEEPER_PRESSURE_COOLDOWN"]
    guard = feed_json(gateway)["guard"]
    assert guard["headline"] == "admission held after pressure" and not guard["admit"]
    assert guard["summary"].startswith("admission is held")
    gateway.scheduler.cooldown.clear()
    assert gateway.headlines.needs_you()["headline"] != "admission held after pressure"


def test_the_summary_judges_the_next_waiting_jobs_own_estimate(gateway: Gateway) -> None:
    """Nothing waiting: the default size; a job waiting: its stated 100 MB."""
    assert gateway.headlines.check().estimate_bytes != 100 * 10**6
    gateway.scheduler.submit(JobSpec(argv=["true"], memory_bytes=100 * 10**6))
    assert gateway.headlines.check().estimate_bytes == 100 * 10**6


def test_the_disk_panel_reads_the_volume_before_the_workspace_exists(gateway: Gateway) -> None:
    """Also when memory refuses first: the volume is read all the same."""
    disk = feed_json(gateway)["disk"]
    assert disk["total_bytes"] and disk["free_bytes"] is not None
    gateway.env["ROOMKEEPER_MEMORY_LIMIT_MB"] = "1"  # type: ignore[index]  # below what is used
    assert gateway.headlines.check().reason.value == "memory"
    disk = feed_json(gateway)["disk"]
    assert disk["total_bytes"] and disk["free_bytes"] is not None


def test_the_health_page_leads_with_what_needs_a_person(gateway: Gateway) -> None:
    """A journal that cannot save heads the page as it heads needs-you."""
    gateway.persistence.note("database or disk is full")
    guard = feed_json(gateway)["guard"]
    assert guard["headline"] == "persistence failed" and not guard["admit"]
    assert guard["summary"].startswith("the journal cannot save")


def test_memory_not_given_back_is_said_with_its_numbers_and_admission_goes_on(
    gateway: Gateway,
) -> None:
    """Once the baseline has stayed up across endings, needs-you and the Health page say
    ``memory not given back`` with the numbers; the guard still admits."""
    assert gateway.headlines.needs_you()["headline"] != "memory not given back"
    watch = gateway.baseline.watch
    line = 10 * GB
    watch.record(BaselineRecord(at=0.0, used=1 * GB, footprints=0, leased=0, line=line))
    for n in range(1, 13):
        watch.ended()
        watch.record(
            BaselineRecord(at=n, used=1 * GB + n * 200 * 10**6, footprints=0, leased=0, line=line)
        )
    said = gateway.headlines.needs_you()
    assert said["headline"] == "memory not given back"
    assert "rose from 1.20 to 3.00 GB" in said["body"] and "/" not in said["body"]
    assert "0 lease(s) ended without a release hook" in said["body"]
    guard = feed_json(gateway)["guard"]
    assert guard["headline"] == "memory not given back" and guard["admit"]
    for n in range(3):
        watch.ended()
        watch.record(BaselineRecord(at=20 + n, used=1 * GB, footprints=0, leased=0, line=line))
    assert gateway.headlines.needs_you()["headline"] != "memory not given back"
