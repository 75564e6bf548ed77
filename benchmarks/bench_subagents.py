"""Subagent sessions admitted through ``roomkeeper hook claude-code``, against count caps.

Each session is a real process that grows steadily, as an agent-server turn does, over
2..4 s and holds its memory 3..6 s (drawn once with a fixed seed): a ``general-purpose``
subagent to 0.25..0.35 GB, or, for a share ``--light`` of them, an ``Explore`` one (a
read-only search) to 0.05..0.10 GB.  Each contender runs in a fresh memory group of
``--limit`` of its own:

- ``hook``: a ``roomkeeper gateway`` inside the group, up before the clock starts (it is
  a service); each session first sends its ``PreToolUse`` (Claude Code's ``Agent`` tool,
  its ``subagent_type``) to ``roomkeeper hook claude-code`` on stdin, as Claude Code
  does, all at once; it starts once the hook exits 0 with no decision, and sends its
  ``PostToolUse`` when it ends.  ``--memory`` is the estimate of a type nothing was
  learned for.  ``--swarms`` swarms go through the one gateway, one after another:
  what the sessions of one gave back as they ended, the next one asks.
- ``hook-http``: the same, with each event posted to the gateway's route, as Claude
  Code's ``http`` hook type does (no process per event).
- ``K`` (a number): at most K sessions at once, a count cap as the tools have it
  (20 is Claude Code's default; an expert picks limit / largest session).

Reported per contender (per swarm for the hooks): sessions done and lost, the time to
finish all, the sessions running at once on average, and the group's OOM kills.
Needs root and a cgroup memory controller.
Usage:
    python benchmarks/bench_subagents.py [--sessions 16] [--limit 1.5G] [--light 0]
        [--contenders hook,hook-http,20,4] [--memory 400M] [--swarms 2] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from live_gateway import free_port, stop_process, wait_answering

from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.kernel.oom_kills import group_oom_kills
from roomkeeper.units import parse_size

GROW = (
    "import sys, time\n"
    "size, grow, hold = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])\n"
    "parts = []\n"
    "for _ in range(20):\n"
    "    parts.append(b'\\x01' * (size // 20)); time.sleep(grow / 20)\n"
    "time.sleep(hold)\n"
)


Session = tuple[int, float, float, str]
"""(size, growth seconds, hold seconds, subagent type)."""


def sessions(seed: int, count: int, light: float) -> list[Session]:
    """The sessions: a share ``light`` of them ``Explore`` subagents of 0.05..0.10 GB (a
    read-only search), the rest ``general-purpose`` ones of 0.25..0.35 GB."""
    rng = random.Random(seed)
    drawn: list[Session] = []
    for _ in range(count):
        heavy = rng.random() >= light
        low, high = (0.25e9, 0.35e9) if heavy else (0.05e9, 0.10e9)
        kind = "general-purpose" if heavy else "Explore"
        drawn.append((int(rng.uniform(low, high)), rng.uniform(2, 4), rng.uniform(3, 6), kind))
    return drawn


def in_group(group: Path, argv: list[str]) -> list[str]:
    """``argv`` run inside ``group`` (joined first)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs"), *argv]


@contextlib.contextmanager
def memory_group(parent: Path, version: int, limit: int):  # type: ignore[no-untyped-def]
    """A fresh child group with ``limit``; its processes killed and it removed after."""
    group = parent / f"rk-subagents-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        name = "memory.max" if version == 2 else "memory.limit_in_bytes"
        (group / name).write_text(str(limit))
        yield group
    finally:
        for _ in range(100):
            pids = (group / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_session(group: Path, session: Session, ran_s: list[float]) -> int:
    """Run one session in ``group``; its exit status, its running seconds added to ``ran_s``."""
    size, grow, hold, _ = session
    argv = in_group(group, [sys.executable, "-c", GROW, str(size), str(grow), str(hold)])
    began = time.monotonic()
    code = subprocess.run(argv, check=False).returncode
    ran_s.append(time.monotonic() - began)
    return code


def at_once(seconds: list[float], wall: float) -> float:
    """Sessions running at once, on average over ``wall``: their running seconds over it."""
    return sum(seconds) / wall if wall > 0 else 0.0


def hook_contender(
    group: Path, work: list[Session], memory: str, swarms: int, kind: str
) -> list[tuple[list[int], float, float]]:
    """``swarms`` swarms one after another through one gateway, every session of a swarm at
    once through the hook; per swarm, each session's exit status and the seconds from its
    first event to its last session's end (the gateway is a service, started before: its
    start is not counted; what a swarm teaches, the next one asks).  ``kind`` is the hook
    type: ``command`` runs ``roomkeeper hook claude-code`` per event, ``http`` posts the
    event to the gateway's route as Claude Code's http hook does.  Also per swarm: the
    sessions running at once, on average."""
    mib = parse_size(memory) >> 20
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
        env.update(
            ROOMKEEPER_HOME=f"{tmp}/home",
            ROOMKEEPER_WORKSPACE=f"{tmp}/ws",
            ROOMKEEPER_JOB_DISK_MB="0",
            ROOMKEEPER_DISK_HEADROOM_PERCENT="0",
            ROOMKEEPER_GATEWAY_RESERVE_MB="0",
        )
        log = Path(tmp) / "gateway.log"
        with log.open("wb") as out:
            argv = [sys.executable, "-m", "roomkeeper", "gateway", "--port", str(port)]
            gateway = subprocess.Popen(in_group(group, argv), env=env, stdout=out, stderr=out)
        try:
            wait_answering(f"http://127.0.0.1:{port}", gateway, log, timeout=120)
            token = (Path(tmp) / "home" / "token").read_text().strip()
            hook_env = {**env, "ROOMKEEPER_URL": f"http://127.0.0.1:{port}"}
            hook_env["ROOMKEEPER_TOKEN"] = token

            def one(i: int, swarm: int, codes: list[int], ran_s: list[float]) -> None:
                pre = {
                    "session_id": f"bench-{swarm}-{i}",
                    "hook_event_name": "PreToolUse",
                    "tool_name": "Agent",
                    "tool_input": {"subagent_type": work[i][3], "prompt": "p"},
                    "tool_use_id": f"toolu_bench{swarm}x{i}",
                }
                post = {**pre, "hook_event_name": "PostToolUse"}
                if kind == "http":  # Claude Code posts the event itself: no process
                    route = f"http://127.0.0.1:{port}/v1/agent-hooks/claude-code"
                    with httpx.Client(headers={"Authorization": f"Bearer {token}"}) as web:
                        said = web.post(route, params={"memory_mb": mib}, json=pre, timeout=600)
                        if said.status_code != 200 or said.json() != {}:
                            codes[i] = -1000  # refused: lost
                            return
                        codes[i] = run_session(group, work[i], ran_s)
                        web.post(route, json=post, timeout=60)
                    return
                hook = [sys.executable, "-m", "roomkeeper", "hook", "claude-code", "--memory"]
                ran = subprocess.run(
                    [*hook, memory],
                    input=json.dumps(pre),
                    env=hook_env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if ran.returncode != 0 or ran.stdout.strip():
                    codes[i] = -1000  # refused: lost
                    return
                codes[i] = run_session(group, work[i], ran_s)
                subprocess.run(
                    hook[:-1],
                    input=json.dumps(post),
                    env=hook_env,
                    capture_output=True,
                    text=True,
                    check=False,
                )

            results: list[tuple[list[int], float, float]] = []
            for swarm in range(swarms):
                time.sleep(2.0)  # a quiet moment, as a service long up has seen
                codes = [0] * len(work)
                ran_s: list[float] = []
                started = time.monotonic()
                threads = [
                    threading.Thread(target=one, args=(i, swarm, codes, ran_s))
                    for i in range(len(work))
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.monotonic() - started
                results.append((codes, wall, at_once(ran_s, wall)))
            return results
        finally:
            stop_process(gateway)


def cap_contender(group: Path, work: list[Session], cap: int, ran_s: list[float]) -> list[int]:
    """At most ``cap`` sessions at once; each session's exit status (running seconds to
    ``ran_s``)."""
    slots = threading.Semaphore(cap)
    codes = [0] * len(work)

    def one(i: int) -> None:
        with slots:
            codes[i] = run_session(group, work[i], ran_s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--limit", default="1.5G")
    parser.add_argument("--contenders", default="hook,hook-http,20,4")
    parser.add_argument("--memory", default="400M", help="the hook's stated estimate")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--light", type=float, default=0.0, help="share of light Explore sessions (0..1)"
    )
    parser.add_argument(
        "--swarms", type=int, default=2, help="swarms through one gateway (the first teaches)"
    )
    args = parser.parse_args()
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    parent, version = Path(own.directory), own.version
    limit = parse_size(args.limit)
    work = sessions(args.seed, args.sessions, args.light)
    print(
        f"cgroup v{version}, limit {limit / 1e9:.2f} GB, {len(work)} sessions of "
        f"{min(w[0] for w in work) / 1e9:.2f}..{max(w[0] for w in work) / 1e9:.2f} GB "
        f"({sum(w[3] == 'Explore' for w in work)} of them Explore; seed {args.seed})",
        flush=True,
    )
    for name in (c.strip() for c in args.contenders.split(",") if c.strip()):
        with memory_group(parent, version, limit) as group:
            started = time.monotonic()
            if name.startswith("hook"):
                kind = "http" if name == "hook-http" else "command"
                if name not in ("hook", "hook-http"):
                    sys.exit(f"unknown contender {name!r}: give hook, hook-http or a number")
                runs = hook_contender(group, work, args.memory, args.swarms, kind)
                labels = [f"{name}, swarm {n + 1}" for n in range(len(runs))]
            elif name.isdigit():
                ran_s: list[float] = []
                codes = cap_contender(group, work, int(name), ran_s)
                wall = time.monotonic() - started
                runs = [(codes, wall, at_once(ran_s, wall))]
                labels = [f"count cap {name}"]
            else:
                sys.exit(f"unknown contender {name!r}: give hook, hook-http or a number")
            kills = group_oom_kills(group, version)
        for label, (codes, wall, running) in zip(labels, runs, strict=True):
            done = sum(1 for c in codes if c == 0)
            print(
                f"{label:24s} done {done:2d}/{len(work)}  lost {len(work) - done:2d}  "
                f"all finished in {wall:6.1f} s  ({running:.2f} at once on average)",
                flush=True,
            )
        print(f"{'':24s} OOM kills in its group: {kills}", flush=True)


if __name__ == "__main__":
    main()
