"""The Health page, in a real browser, against a real gateway.

Debian's chromium (``/usr/bin/chromium``) is driven by Playwright for Python; no
browser is downloaded.  The gateway is ``python -m roomkeeper serve`` in a child
process with its own home and workspace, stopped with SIGTERM whatever happens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateways import RunningGateway, running_gateway, stop_process
from tests.pages import PAGE_TIMEOUT_MS

# The chart has drawn at least one sample, with a path for memory used.
CHART_DRAWN = """() => {
    const chart = document.querySelector('#chart');
    const used = chart && chart.querySelector('path.used');
    return !!chart && Number(chart.dataset.points) >= 1 && !!used && !!used.getAttribute('d');
}"""

# The jobs table has a row for this job, owned by this owner.
JOB_ROW = """([id, owner]) => [...document.querySelectorAll('#jobs tr[data-job-id]')].some(
    (row) => row.dataset.jobId === id && row.querySelector('td.owner').textContent === owner)"""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """A real supervised gateway on a free loopback port, always stopped with SIGTERM."""
    with running_gateway(tmp_path, supervised=True) as gw:
        yield gw


def _open(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(url)
    return page, errors


def test_health_page_shows_chart_guard_and_a_submitted_job(
    browser: Any, gateway: RunningGateway, tmp_path: Path
) -> None:
    """The page draws the chart, the guard's headline and a submitted job's row with its owner."""
    answer = httpx.post(
        f"{gateway.url}/v1/jobs",
        headers={"Authorization": f"Bearer {gateway.token}"},
        json={"argv": ["sleep", "30"], "owner": "alice"},
        timeout=10.0,
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]

    page, errors = _open(browser, f"{gateway.url}/")
    page.wait_for_function(CHART_DRAWN, timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(JOB_ROW, arg=[job_id, "alice"], timeout=PAGE_TIMEOUT_MS)

    row = page.locator("#jobs tr[data-job-id]").filter(has_text="alice").first
    assert row.get_attribute("data-job-id") == job_id
    assert row.locator("td.state").inner_text().strip() in {"running", "waiting"}
    assert row.locator("td.reason").inner_text().strip()
    assert page.locator("#owners [data-owner='alice']").count() == 1
    headline = page.locator("#headline").inner_text().strip()
    assert headline and headline != "…"
    assert page.locator("#summary").inner_text().strip()
    assert page.locator("#banner").is_hidden()
    assert page.locator("#nodes-card").is_hidden()  # the local backend has no Ray nodes
    page.screenshot(path=str(tmp_path / "health.png"), full_page=True)
    assert errors == []


def test_health_page_shows_a_sessions_leases_under_leases(
    browser: Any, gateway: RunningGateway
) -> None:
    """A lease that names its agent session shows as that session's row under Leases, with
    how many leases it holds."""
    answer = httpx.post(
        f"{gateway.url}/v1/leases",
        headers={"Authorization": f"Bearer {gateway.token}"},
        json={"id": "sub-1", "owner": "claude-code", "memory_bytes": 1 << 20, "session": "s-42"},
        timeout=10.0,
    )
    assert answer.status_code == 201, answer.text

    page, errors = _open(browser, f"{gateway.url}/")
    row = page.locator("#sessions [data-session='s-42']")
    row.wait_for(timeout=PAGE_TIMEOUT_MS)
    assert "session s-42" in row.inner_text()
    assert "1 held" in row.inner_text()
    assert page.locator("section.card:has(h2:text-is('Leases')) #sessions").count() == 1
    assert errors == []


def test_health_page_describes_every_reason_the_api_may_send(
    browser: Any, gateway: RunningGateway
) -> None:
    """Every job reason ``/openapi.json`` lists shows on the page in words, its code beside them."""
    document = httpx.get(f"{gateway.url}/openapi.json", timeout=10.0).json()
    reason = document["components"]["schemas"]["FeedJob"]["properties"]["reason"]
    codes = next(s["enum"] for s in reason["anyOf"] if "enum" in s)
    feed = httpx.get(f"{gateway.url}/v1/feed", timeout=10.0).json()
    feed["jobs"] = [
        {
            "id": f"job-{code}",
            "owner": "words",
            "state": "waiting",
            "reason": code,
            "exit_code": None,
            "submitted_at": feed["now"],
            "started_at": None,
            "ended_at": None,
        }
        for code in codes
    ]
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    # The page is the server's own; only its feed is this one, a job waiting for each reason.
    page.route(
        "**/v1/feed",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(feed)
        ),
    )
    page.goto(f"{gateway.url}/")
    page.wait_for_function(
        "(n) => document.querySelectorAll('#jobs tr[data-job-id]').length === n",
        arg=len(codes),
        timeout=PAGE_TIMEOUT_MS,
    )
    shown = page.eval_on_selector_all(
        "#jobs tr[data-job-id]",
        """(rows) => rows.map((row) => {
            const cell = row.querySelector('td.reason');
            const code = cell.querySelector('.code');
            return [row.dataset.jobId, cell.firstChild.textContent, code && code.textContent];
        })""",
    )
    bare = [
        job_id.removeprefix("job-")
        for job_id, words, code in shown
        if code != job_id.removeprefix("job-") or not words.strip() or words == code
    ]
    assert bare == [], f"reasons the Health page shows without words: {bare}"
    assert errors == []


def test_health_page_says_when_the_gateway_is_unreachable(
    browser: Any, gateway: RunningGateway
) -> None:
    """Once the gateway stops answering, the page shows the "gateway unreachable" banner."""
    page, errors = _open(browser, f"{gateway.url}/")
    page.wait_for_function(
        "() => document.querySelector('#headline').textContent !== '…'", timeout=PAGE_TIMEOUT_MS
    )
    assert page.locator("#banner").is_hidden()
    stop_process(gateway.proc)
    page.wait_for_selector("#banner", state="visible", timeout=PAGE_TIMEOUT_MS)
    assert "unreachable" in page.locator("#banner").inner_text()
    assert errors == []
