"""Bad input gets a clear 4xx at once: never a traceback, never a 201 that fails later."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.gateways import RunningGateway

pytestmark = pytest.mark.kernel


def refused(module_gw: RunningGateway, path: str, body: object) -> str:
    """POST ``body`` (raw JSON text when a str) and expect 422; the answer's text."""
    if isinstance(body, str):
        answer = module_gw.client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
    else:
        answer = module_gw.client.post(path, json=body)
    assert answer.status_code == 422, answer.text
    return answer.text


def test_a_relative_cwd_is_refused(module_gw: RunningGateway) -> None:
    """``cwd`` must be absolute: a relative one would be resolved against the gateway's own."""
    text = refused(module_gw, "/v1/jobs", {"argv": ["true"], "cwd": "src"})
    assert "cwd must be an absolute path" in text


def test_a_missing_cwd_is_refused(module_gw: RunningGateway, tmp_path: Path) -> None:
    """A directory that does not exist is named in the refusal."""
    text = refused(module_gw, "/v1/jobs", {"argv": ["true"], "cwd": str(tmp_path / "nowhere")})
    assert "is not an existing directory" in text


def test_a_command_not_on_the_jobs_path_is_refused(module_gw: RunningGateway) -> None:
    """argv[0] must resolve on the job's PATH; the refusal says how to fix it."""
    text = refused(module_gw, "/v1/jobs", {"argv": ["no-such-command-rk"]})
    assert "is not an executable file on the job's PATH" in text
    text = refused(module_gw, "/v1/jobs", {"argv": ["true"], "env": {"PATH": "/nonexistent"}})
    assert "'true' is not an executable file" in text
    assert module_gw.client.post("/v1/jobs", json={"argv": ["/bin/true"]}).status_code == 201


@pytest.mark.parametrize("value", ['"100"', "true", "1.5"])
def test_sizes_are_strict_integers(module_gw: RunningGateway, value: str) -> None:
    """``"memory_bytes": "100"`` or ``true`` is refused, not coerced to 100 or 1."""
    refused(module_gw, "/v1/jobs", f'{{"argv": ["true"], "memory_bytes": {value}}}')
    refused(module_gw, "/v1/leases", f'{{"memory_bytes": {value}}}')


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/jobs", '{{"argv": ["true"], "timeout_s": {}}}'),
        ("/v1/leases", '{{"ttl_s": {}}}'),
        ("/v1/leases", '{{"wait_s": {}}}'),
    ],
)
def test_non_finite_numbers_get_a_422_not_a_500(
    module_gw: RunningGateway, path: str, body: str, value: str
) -> None:
    """NaN and infinities are refused, and the refusal itself can be written as JSON."""
    text = refused(module_gw, path, body.format(value))
    assert "finite" in text or "greater" in text or "less" in text


def test_non_finite_outcome_numbers_get_a_422(module_gw: RunningGateway) -> None:
    """An outcome's ``numbers`` refuse NaN too."""
    call = module_gw.client.post("/v1/calls", json={"kind": "tool"}).json()["id"]
    refused(
        module_gw, f"/v1/calls/{call}/outcome", '{"outcome": "succeeded", "numbers": {"x": NaN}}'
    )


def test_a_job_that_can_never_fit_is_refused_at_once(module_gw: RunningGateway) -> None:
    """Memory above the guard's line with nothing else running: 422 with the numbers."""
    text = refused(module_gw, "/v1/jobs", {"argv": ["true"], "memory_bytes": 2**52})
    assert "no room for memory even with nothing else running" in text
    text = refused(
        module_gw, "/v1/jobs", {"argv": ["true"], "memory_bytes": 0, "disk_bytes": 2**52}
    )
    assert "no room on disk even when it is empty" in text


def test_an_empty_program_is_refused_and_the_document_says_so(module_gw: RunningGateway) -> None:
    """argv[0] must be non-empty, and the OpenAPI document says it (later items may be
    empty: ``printf ''`` is a real command)."""
    text = refused(module_gw, "/v1/jobs", {"argv": [""]})
    assert "argv[0] is empty" in text
    assert module_gw.client.post("/v1/jobs", json={"argv": ["printf", ""]}).status_code == 201
    document = module_gw.anonymous.get("/openapi.json")
    if document.status_code != 200:
        document = module_gw.client.get("/openapi.json")
    argv = document.json()["components"]["schemas"]["JobIn"]["properties"]["argv"]
    assert argv["prefixItems"][0]["minLength"] == 1


def test_resolving_a_job_that_is_not_uncertain_is_a_conflict(module_gw: RunningGateway) -> None:
    """Resolve on an exited job is valid input its state forbids: 409 ``not_uncertain``."""
    job_id = module_gw.client.post("/v1/jobs", json={"argv": ["true"]}).json()["id"]
    deadline = time.monotonic() + 60
    while module_gw.client.get(f"/v1/jobs/{job_id}").json()["state"] != "exited":
        assert time.monotonic() < deadline, "the job never exited"
        time.sleep(0.05)
    answer = module_gw.client.post(f"/v1/jobs/{job_id}/resolve", json={"resolution": "failed"})
    assert answer.status_code == 409, answer.text
    assert answer.json()["reason"] == "not_uncertain"
    assert "not uncertain" in answer.json()["detail"]
    document = module_gw.anonymous.get("/openapi.json").json()
    route = document["paths"]["/v1/jobs/{job_id}/resolve"]["post"]["responses"]
    assert "409" in route
    assert "not_uncertain" in str(document["components"]["schemas"]["ErrorOut"])
