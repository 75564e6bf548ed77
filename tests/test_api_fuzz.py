"""Schemathesis against the served OpenAPI document: crafted input never causes a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.gateways import RunningGateway, running_gateway

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # Jobs from fuzzed argv must not find real programs: an empty PATH, few slots.
    tmp = tmp_path_factory.mktemp("fuzz")
    empty = tmp / "empty-path"
    empty.mkdir()
    with running_gateway(tmp, PATH=str(empty), ROOMKEEPER_MAX_RUNNING="2") as gw:
        yield gw


def test_no_input_makes_the_gateway_fail(served: RunningGateway) -> None:
    """Any generated request, with or without the token, gets no 5xx answer."""
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    # POST /v1/shutdown would end the gateway under test; it has its own tests.
    strategy = schema.exclude(path="/v1/shutdown").as_strategy()
    headers = {"Authorization": f"Bearer {served.token}"}
    seen: set[str] = set()

    @settings(
        max_examples=500, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict) and "wait_s" in case.body:
            case.body["wait_s"] = 0  # waiting for room is tested elsewhere; keep this fast
        seen.add(f"{case.method} {case.operation.path}")
        case.call_and_validate(headers=headers, checks=[not_a_server_error])
        case.call_and_validate(checks=[not_a_server_error])

    check()
    assert len(seen) >= 10, seen  # every operation was exercised


def test_oversized_body_is_refused_with_413(served: RunningGateway) -> None:
    """A body over 1 MiB is refused before it is parsed."""
    answer = served.client.post(
        "/v1/jobs", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413


def test_gateway_still_healthy_after_fuzzing(served: RunningGateway, tmp_path: Path) -> None:
    """After the fuzzing the gateway still answers its health probe."""
    assert served.anonymous.get("/health").status_code == 200
