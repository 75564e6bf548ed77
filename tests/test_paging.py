"""Long lists come in pages: limit and cursor in, the next page's cursor out; the CLI follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from roomkeeper.api.paging import decode_cursor, encode_cursor, newest_first_page
from roomkeeper.errors import UsageError
from tests.gateways import RunningGateway, gateway_env, roomkeeper_cli, running_gateway

pytestmark = pytest.mark.kernel


def test_pages_are_newest_first_and_never_skip_an_item_with_equal_times() -> None:
    items = [{"id": f"{i:03d}", "at": float(i // 3)} for i in range(10)]  # times repeat
    seen, after = [], None
    while True:
        page, after = newest_first_page(items, "at", 4, after)
        seen += page
        if after is None:
            break
        after = decode_cursor(encode_cursor(after))  # as a client passes it back
    assert [i["id"] for i in seen] == sorted((i["id"] for i in items), reverse=True)


def test_a_cursor_is_a_position_any_valid_one_is_taken_and_others_refused() -> None:
    key = (1796286582.5969081, "a1b2c3")
    assert decode_cursor(encode_cursor(key)) == key  # exactly: the float round-trips
    assert decode_cursor("12.5~made-up") == (12.5, "made-up")  # a position all the same
    with pytest.raises(UsageError, match="X-Next-Cursor"):
        decode_cursor("bm90IGpzb24")


def _submit(gw: RunningGateway, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        answer = gw.client.post("/v1/jobs", json={"argv": ["true"], "owner": "pager"})
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    return ids


def test_jobs_and_leases_come_in_pages_and_the_cli_follows(tmp_path: Path) -> None:
    with running_gateway(tmp_path) as gw:
        ids = _submit(gw, 7)
        first = gw.client.get("/v1/jobs", params={"limit": 3, "owner": "pager"})
        assert first.status_code == 200 and len(first.json()) == 3
        assert 'rel="next"' in first.headers["Link"]
        listed, answer = list(first.json()), first
        while "X-Next-Cursor" in answer.headers:
            answer = gw.client.get(
                "/v1/jobs",
                params={"limit": 3, "owner": "pager", "cursor": answer.headers["X-Next-Cursor"]},
            )
            assert answer.status_code == 200, answer.text
            listed += answer.json()
        assert sorted(j["id"] for j in listed) == sorted(ids)
        assert len({j["id"] for j in listed}) == len(listed)  # none twice
        bad = gw.client.get("/v1/jobs", params={"cursor": "bm90IGpzb24"})
        assert bad.status_code == 422 and "cursor" in bad.text
        assert gw.client.get("/v1/jobs", params={"limit": 0}).status_code == 422
        for i in range(3):
            lease = {"id": f"lease-{i}", "owner": "pager", "memory_bytes": 1, "disk_bytes": 0}
            assert gw.client.post("/v1/leases", json=lease).status_code == 201
        leases = gw.client.get("/v1/leases", params={"limit": 2})
        assert len(leases.json()) == 2 and "X-Next-Cursor" in leases.headers
        env = gateway_env(tmp_path)
        shown = roomkeeper_cli(env, "jobs", "--owner", "pager", "--limit", "5")
        assert shown.returncode == 0, shown.stderr
        assert "roomkeeper jobs (5, more: --all or --limit)" in shown.stdout
        every = roomkeeper_cli(env, "jobs", "--owner", "pager", "--all")
        assert "roomkeeper jobs (7)" in every.stdout
