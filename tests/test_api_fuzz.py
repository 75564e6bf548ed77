"""Schemathesis against the served OpenAPI document: every check, the stateful walk included.

Crafted input never causes a 5xx, and the document is the contract: every status
declared, every body as described, schema-valid requests accepted, invalid ones
refused, auth enforced, 405s listing their methods.  Two deliberate deviations
from schemathesis' defaults, each for a reason the schema cannot carry:

* ``positive_data_acceptance``: a schema-valid job may still be refused with 422
  when *this machine* cannot run it (``cwd_not_found``, ``command_not_found``,
  ``never_fits``, or its worktree cannot be made: ``not_a_repository``, ...);
  any other refusal of a valid request fails.
* ``negative_data_rejection`` runs in the first test only (see the walk's comment).

``use_after_free`` runs: ``DELETE`` of a job or call removes its record (once it
has ended and is not in doubt; a cancel is ``POST .../cancel``), so every later
``GET`` of it answers 404.  Every success body is checked against its declared
model (``response_schema_conformance``); :func:`test_every_success_body_is_a_model`
holds that none of them is an untyped object.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis.checks import CHECKS, load_all_checks, not_a_server_error
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    use_after_free,
)

from tests.gateways import RunningGateway, running_gateway

pytestmark = pytest.mark.kernel

UNRUNNABLE = {
    "cwd_not_found",
    "command_not_found",
    "never_fits",
    # A job's worktree: the repository path is no repository here, and so on.
    "not_a_repository",
    "invalid_branch",
    "branch_checked_out",
    "dirty_base",
    "worktree_failed",
}
SIDE_DOORS = ("/v1/shutdown", "/v1/restart", "/v1/repair")  # they end or reset the gateway


@schemathesis.check
def valid_requests_are_accepted(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """schemathesis' positive_data_acceptance, but a job this machine cannot run may be 422."""
    if response.status_code == 422:
        try:
            reason = response.json().get("reason")
        except ValueError:
            reason = None
        if reason in UNRUNNABLE:
            return None
    return positive_data_acceptance(ctx, response, case)


def keep_it_fast(case: schemathesis.Case) -> None:
    """A valid wait for room becomes no wait (tested elsewhere); an invalid one stays invalid."""
    if isinstance(case.body, dict):
        wait = case.body.get("wait_s")
        # Only a wait the schema admits (0 < wait_s <= 600) is shortened: an out-of-range
        # one is negative data and must reach the server as it is, to be refused.
        if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 < wait <= 600:
            case.body["wait_s"] = 0


def empty_the_server(gw: RunningGateway) -> None:
    """Settle and remove every call and job, release every lease: each walk starts alike.

    Hypothesis replays choice prefixes it has seen; a walk whose first listing
    holds what an earlier walk left behind draws differently, and hypothesis
    calls that a flaky strategy.  The API's own routes do the emptying.
    """
    client = gw.client
    for call in client.get("/v1/calls").json():
        call_id = call["id"]
        if call["state"] == "pending":
            client.post(f"/v1/calls/{call_id}/cancel")
        client.post(f"/v1/calls/{call_id}/resolve", json={"resolution": "failed"})
        client.delete(f"/v1/calls/{call_id}")
    for job in client.get("/v1/jobs").json():
        client.post(f"/v1/jobs/{job['id']}/cancel")
        client.delete(f"/v1/jobs/{job['id']}")
    for lease in client.get("/v1/leases").json():
        if lease["state"] == "granted":
            client.delete(f"/v1/leases/{lease['id']}")


def every_check() -> list[Any]:
    load_all_checks()
    skipped = {positive_data_acceptance}  # replaced by valid_requests_are_accepted
    return [c for c in CHECKS.get_all() if c not in skipped] + [valid_requests_are_accepted]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    # Jobs from fuzzed argv must not find real programs: an empty PATH, few slots.
    tmp = tmp_path_factory.mktemp("fuzz")
    empty = tmp / "empty-path"
    empty.mkdir()
    with running_gateway(tmp, PATH=str(empty), ROOMKEEPER_MAX_RUNNING="2") as gw:
        yield gw


def the_schema(served: RunningGateway) -> Any:
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    for path in SIDE_DOORS:
        schema = schema.exclude(path=path)
    return schema


def test_every_operation_keeps_the_contract(served: RunningGateway) -> None:
    """Any generated request, with the token, passes every check; without it, no 5xx."""
    strategy = the_schema(served).as_strategy()
    headers = {"Authorization": f"Bearer {served.token}"}
    checks = every_check()
    seen: set[str] = set()

    @settings(
        max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=strategy)
    def check(case: schemathesis.Case) -> None:
        keep_it_fast(case)
        seen.add(f"{case.method} {case.operation.path}")
        case.call_and_validate(headers=headers, checks=checks)
        case.call_and_validate(checks=[not_a_server_error])

    check()
    assert len(seen) >= 10, seen  # every operation was exercised


def test_stateful_walks_keep_the_contract(served: RunningGateway) -> None:
    """Chains that follow the document's links (create, then read, cancel, resolve by id)."""
    headers = {"Authorization": f"Bearer {served.token}"}
    # Negative data is the first test's: in a walk, schemathesis mutates requests whose ids
    # came from earlier answers, and a retried lease id answers with the lease it already
    # holds, so a mutation there is not always one the server is asked to judge.
    checks = [c for c in every_check() if c is not negative_data_rejection]

    class Walk(the_schema(served).as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": headers, "timeout": 30}

        def before_call(self, case: schemathesis.Case) -> None:
            keep_it_fast(case)

        def teardown(self) -> None:
            empty_the_server(served)

        def validate_response(self, response: Any, case: schemathesis.Case, **kw: Any) -> None:
            # The recorder is what lets stateful checks (use_after_free, ...) see the earlier
            # steps: without it they pass without looking.
            case.validate_response(response, checks=checks, recorder=self.recorder)

    walk = settings(
        max_examples=40,
        phases=[Phase.generate],  # shrinking replays against a server whose state moved on
        stateful_step_count=6,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    for attempt in range(3):
        try:
            Walk.run(settings=walk)
            return
        except FlakyStrategyDefinition:
            # Not a contract failure: the gateway's state moved between two walks (leases
            # reached their cap, say), so a link hypothesis had followed gave nothing.  A
            # contract failure raises schemathesis' own errors and is never retried.
            if attempt == 2:
                raise


def test_removed_calls_stay_gone(served: RunningGateway) -> None:
    """Walks over the calls alone reach register, outcome, DELETE, GET: use_after_free bites.

    The whole document's walk seldom settles a call before it deletes it (fuzzed jobs
    never run here, so their DELETE is always a 409): this one walks only ``/v1/calls``.
    """
    headers = {"Authorization": f"Bearer {served.token}"}
    checks = [c for c in every_check() if c is not negative_data_rejection]
    schema = the_schema(served).include(path_regex="^/v1/calls")

    class Walk(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": headers, "timeout": 30}

        def teardown(self) -> None:
            empty_the_server(served)

        def validate_response(self, response: Any, case: schemathesis.Case, **kw: Any) -> None:
            # The recorder is what lets stateful checks (use_after_free, ...) see the earlier
            # steps: without it they pass without looking.
            case.validate_response(response, checks=checks, recorder=self.recorder)

    Walk.run(
        settings=settings(
            max_examples=80,  # 200 took 104 s beside a CPU hog; 80 walks still reach every route
            phases=[Phase.generate],
            stateful_step_count=8,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
    )


def test_the_checks_include_conformance_and_use_after_free() -> None:
    """The fuzzing runs the two checks this contract was made for, not a list that lost them."""
    assert {response_schema_conformance, use_after_free} <= set(every_check())


def untyped(schema: dict[str, Any], components: dict[str, Any]) -> list[str]:
    """Where a schema leaves a JSON object's shape open (no properties, or any extra key)."""
    if "$ref" in schema:
        return untyped(components[schema["$ref"].rsplit("/", 1)[1]], components)
    found = [] if schema else ["an empty schema"]
    shapeless = not schema.get("properties")
    if (
        schema.get("type") == "object"
        and shapeless
        and not isinstance(schema.get("additionalProperties"), dict)
    ):
        found.append(f"an object without properties: {schema.get('title', '')}")
    if schema.get("additionalProperties") is True:
        found.append(f"an object open to any key: {schema.get('title', '')}")
    for part in ("items", "additionalProperties"):
        if isinstance(schema.get(part), dict):
            found += untyped(schema[part], components)
    for sub in (*schema.get("properties", {}).values(), *schema.get("anyOf", ())):
        found += untyped(sub, components)
    return found


def test_every_success_body_is_a_model(served: RunningGateway) -> None:
    """Every 2xx of every route declares its real body: a model, text, or nothing (204)."""
    document = served.anonymous.get("/openapi.json").json()
    components = document["components"]["schemas"]
    loose = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                if not status.startswith("2") or status == "204":
                    continue
                bodies = answer.get("content", {})
                found = [] if bodies else ["no body declared"]
                for media, body in bodies.items():
                    if media != "text/plain":
                        found += untyped(body.get("schema", {}), components)
                if found:
                    loose[f"{method.upper()} {path} {status}"] = found
    assert not loose, loose


def test_oversized_body_is_refused_with_413(served: RunningGateway) -> None:
    """A body over 1 MiB is refused before it is parsed."""
    answer = served.client.post(
        "/v1/jobs", content=b"x" * (2 * 1024 * 1024), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 413


def test_gateway_still_healthy_after_fuzzing(served: RunningGateway, tmp_path: Path) -> None:
    """After the fuzzing the gateway still answers its health probe."""
    assert served.anonymous.get("/health").status_code == 200


def test_every_429_declares_retry_after(served: RunningGateway) -> None:
    """Every 429 of every route declares the Retry-After header it carries, as required."""
    document = served.anonymous.get("/openapi.json").json()
    bare = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            too_many = operation["responses"].get("429")
            if too_many is None:
                continue
            header = too_many.get("headers", {}).get("Retry-After", {})
            if not header.get("required") or header.get("schema", {}).get("type") != "integer":
                bare.append(f"{method.upper()} {path}")
    assert not bare, f"429 without a required integer Retry-After: {bare}"
    assert "429" in document["paths"]["/v1/leases"]["post"]["responses"]
