"""``roomkeeper hook claude-code`` and ``roomkeeper hook codex`` driven exactly as the tools
drive them (the event's JSON on stdin, the exit status and stdout read back), against a
real gateway: in a 1 GiB group with real memory, only the subagents that fit run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.agent_events import (
    Swarm,
    claude_post,
    claude_pre_agent,
    claude_subagent_stop,
    codex_pre_bash,
    decision,
    run_hook,
)
from tests.cgroups import MemoryBox, memory_box
from tests.gateways import RunningGateway, free_port, gateway_env, gateway_in_box, wait_until

GIB = 1 << 30
SUBAGENT_MB = 300


def hook_env(tmp: Path, url: str, token: str) -> dict[str, str]:
    return gateway_env(tmp, ROOMKEEPER_URL=url, ROOMKEEPER_TOKEN=token)


def box_hook_env(tmp: Path, client: httpx.Client) -> dict[str, str]:
    token = client.headers["Authorization"].removeprefix("Bearer ")
    return hook_env(tmp, str(client.base_url).rstrip("/"), token)


def lease_states(client: httpx.Client) -> dict[str, str]:
    return {v["id"]: v["state"] for v in client.get("/v1/leases").json()}


@dataclass(frozen=True)
class Box:
    """One 1 GiB group with a gateway in it, shared by the swarm tests of every mode."""

    box: MemoryBox
    client: httpx.Client
    env: dict[str, str]

    def swarm(self, agent_type: str) -> Swarm:
        """A swarm of 300 MB subagents; its own agent type keeps its calls apart."""
        return Swarm(self.box, self.env, self.client, mb=SUBAGENT_MB, agent_type=agent_type)


@pytest.fixture(scope="module")
def gib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    """The group and its gateway, for this module's swarms; removed whatever happens."""
    tmp = tmp_path_factory.mktemp("gib")
    with memory_box(GIB) as box, gateway_in_box(box, tmp) as (client, _):
        yield Box(box, client, box_hook_env(tmp, client))


def calls(name: str) -> list[str]:
    return [f"toolu_01{name}{i:02d}" for i in range(12)]


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_twelve_subagents_in_a_gib_wait_for_room(gib: Box) -> None:
    """12 PreToolUse at once for 300 MB subagents in a 1 GiB group: only what fits runs at
    once, the rest wait in the hook and run as earlier ones end; no OOM kill."""
    swarm = gib.swarm("waiter")
    ids = calls("wait")
    said = swarm.wave(ids, lambda i: swarm.call(i, "--wait", "120"))
    assert set(said.values()) == {"allow"}
    assert 1 <= swarm.most <= GIB // (SUBAGENT_MB << 20) < len(ids)
    assert swarm.exits == [0] * len(ids)
    assert gib.box.oom_kills() == 0
    states = lease_states(gib.client)
    assert {states[f"cc:{i.replace('_', '-')}"] for i in ids} == {"released"}


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_deny_mode_refuses_what_does_not_fit_saying_why(gib: Box) -> None:
    """deny: what does not fit is refused at once with the memory needed and free; asked
    again as earlier ones end, every call runs; no OOM kill."""
    swarm = gib.swarm("denied")
    ids = calls("deny")
    waves = swarm.until_all_done(ids, "deny")
    firsts = list(swarm.answers.values())
    assert firsts.count("deny") >= 1 and waves >= 2
    assert 1 <= swarm.most <= GIB // (SUBAGENT_MB << 20)
    assert swarm.exits == [0] * len(ids)
    assert gib.box.oom_kills() == 0
    # The reason is one the model can act on: needed and free memory, and what to do.
    held = claude_pre_agent("toolu_01held")
    big = run_hook(gib.env, "claude-code", held, "--mode", "deny", "--memory", "2G")
    reason = json.loads(big.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert big.returncode == 0 and "needs 2048 MiB" in reason and "MiB is free" in reason


@pytest.mark.kernel
@pytest.mark.cgroups
@pytest.mark.long_on_v2
def test_defer_mode_defers_and_the_resumed_call_runs(gib: Box) -> None:
    """defer: what does not fit is deferred (claude -p exits, --resume asks again with the
    same tool_use_id) and runs once room came; no OOM kill."""
    swarm = gib.swarm("deferred")
    ids = calls("defer")
    swarm.until_all_done(ids, "defer")
    assert "defer" in swarm.answers.values()
    assert set(swarm.answers.values()) <= {"allow", "defer"}
    assert 1 <= swarm.most <= GIB // (SUBAGENT_MB << 20)
    assert swarm.exits == [0] * len(ids)
    assert gib.box.oom_kills() == 0


def test_a_dead_gateway_blocks_with_exit_2(tmp_path: Path) -> None:
    """No gateway answering: exit 2 with the reason on stderr, never a silent pass."""
    env = hook_env(tmp_path, f"http://127.0.0.1:{free_port()}", "t")
    done = run_hook(env, "claude-code", claude_pre_agent("toolu_01dead"))
    assert done.returncode == 2
    assert "blocked" in done.stderr and "no answer" in done.stderr
    broken = run_hook(env, "codex", codex_pre_bash("call_1", "make"), "--bash")
    assert broken.returncode == 2


def test_bad_input_blocks_with_exit_2(module_gw: RunningGateway, tmp_path: Path) -> None:
    """Stdin that is not an event, or defer for Codex (which has none, refused before the
    gateway is asked), exits 2 saying why."""
    env = hook_env(tmp_path, module_gw.url, module_gw.token)
    done = subprocess.run(
        [sys.executable, "-m", "roomkeeper", "hook", "claude-code"],
        input="not json",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "blocked" in done.stderr
    # Refused up front, before the gateway is asked: no gateway answers on this port.
    nowhere = hook_env(tmp_path, f"http://127.0.0.1:{free_port()}", "t")
    deferred = run_hook(nowhere, "codex", codex_pre_bash("call_1", "make"), "--mode", "defer")
    assert deferred.returncode == 2 and "defer is Claude Code's" in deferred.stderr


def test_a_crashed_tool_s_lease_heals_by_its_ttl(module_gw: RunningGateway, tmp_path: Path) -> None:
    """A PreToolUse with no PostToolUse (the tool crashed): its lease expires by its ttl."""
    env = hook_env(tmp_path, module_gw.url, module_gw.token)
    # 5 s: the lease must still be granted when it is first looked at, after the hook's
    # process has ended, on a machine however busy.
    done = run_hook(env, "claude-code", claude_pre_agent("toolu_01crash"), "--ttl", "5")
    assert decision(done) == "allow"
    assert lease_states(module_gw.client)["cc:toolu-01crash"] == "granted"
    wait_until(
        lambda: lease_states(module_gw.client)["cc:toolu-01crash"] == "expired", "the ttl's expiry"
    )


def test_sessions_show_on_status_and_post_tool_use_releases(
    module_gw: RunningGateway, tmp_path: Path
) -> None:
    """A session's leases show on /v1/status under its session_id; PostToolUse ends them."""
    env = hook_env(tmp_path, module_gw.url, module_gw.token)
    pre = claude_pre_agent("toolu_01seen", session="sess-seen")
    assert decision(run_hook(env, "claude-code", pre, "--memory", "50M")) == "allow"
    held = module_gw.client.get("/v1/status").json()["sessions"]["sess-seen"]
    assert held == {"leases": 1, "memory_bytes": 50 << 20}
    assert decision(run_hook(env, "claude-code", claude_post(pre))) == "allow"
    assert "sess-seen" not in module_gw.client.get("/v1/status").json()["sessions"]
    assert lease_states(module_gw.client)["cc:toolu-01seen"] == "released"


def test_a_background_subagent_is_released_by_subagent_stop(
    module_gw: RunningGateway, tmp_path: Path
) -> None:
    """A background subagent's PostToolUse comes at once; its SubagentStop releases it."""
    env = hook_env(tmp_path, module_gw.url, module_gw.token)
    pre = claude_pre_agent("toolu_01bg", session="s-bg", background=True, agent_type="Explore")
    assert decision(run_hook(env, "claude-code", pre, "--memory", "20M")) == "allow"
    run_hook(env, "claude-code", claude_post(pre))
    lease_id = "cc-bg:Explore:toolu-01bg"
    assert lease_states(module_gw.client)[lease_id] == "granted"
    run_hook(env, "claude-code", claude_subagent_stop("s-bg", "Explore"))
    assert lease_states(module_gw.client)[lease_id] == "released"


def test_codex_bash_calls_are_gated_when_asked(module_gw: RunningGateway, tmp_path: Path) -> None:
    """Codex: a Bash PreToolUse takes a lease with --bash (a refusal is deny in
    hookSpecificOutput), and passes untouched without it."""
    env = hook_env(tmp_path, module_gw.url, module_gw.token)
    event = codex_pre_bash("call_01", "pytest -q")
    assert decision(run_hook(env, "codex", event)) == "allow"
    assert "codex:call-01" not in lease_states(module_gw.client)
    assert decision(run_hook(env, "codex", event, "--bash", "--memory", "10M")) == "allow"
    assert lease_states(module_gw.client)["codex:call-01"] == "granted"
    huge = codex_pre_bash("call_02", "make -j64")
    assert (
        decision(run_hook(env, "codex", huge, "--bash", "--mode", "deny", "--memory", "4T"))
        == "deny"
    )


def test_claude_code_s_http_hook_is_answered_by_the_gateway(module_gw: RunningGateway) -> None:
    """The http hook type: the event posted as the body, the answer the tool reads."""
    pre = claude_pre_agent("toolu_01http")
    answer = module_gw.client.post("/v1/agent-hooks/claude-code?memory_mb=10", json=pre)
    assert answer.status_code == 200 and answer.json() == {}
    refused = module_gw.client.post(
        "/v1/agent-hooks/claude-code?mode=deny&memory_mb=8000000", json=claude_pre_agent("t2")
    )
    said = refused.json()["hookSpecificOutput"]
    assert said["hookEventName"] == "PreToolUse" and said["permissionDecision"] == "deny"
    module_gw.client.post("/v1/agent-hooks/claude-code", json=claude_post(pre))
    assert lease_states(module_gw.client)["cc:toolu-01http"] == "released"
