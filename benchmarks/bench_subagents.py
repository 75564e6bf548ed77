"""Subagent sessions admitted through ``roomkeeper hook claude-code``, against count caps.

Each session is a real process that grows steadily, as an agent-server turn does,
to 0.25..0.35 GB over 2..4 s and holds it 3..6 s (drawn once with a fixed seed),
in a memory group of ``--limit``.  Contenders, each in a fresh group of its own:

- ``hook``: a ``roomkeeper gateway`` inside the group; each session first sends its
  ``PreToolUse`` (Claude Code's ``Agent`` tool) to ``roomkeeper hook claude-code``
  on stdin, as Claude Code does, all at once; it starts once the hook exits 0 with
  no decision, and sends its ``PostToolUse`` when it ends (``--memory`` is the
  stated estimate, nothing learned);
- ``K`` (a number): at most K sessions at once, a count cap as the tools have it
  (20 is Claude Code's default; an expert picks limit / largest session).

Reported per contender: sessions done and lost, the group's OOM kills, and the
time to finish all.  Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_subagents.py [--sessions 16] [--limit 1.5G]
        [--contenders hook,20,4] [--memory 400M] [--seed 1]
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


def sessions(seed: int, count: int) -> list[tuple[int, float, float]]:
    """(size, growth seconds, hold seconds) per session."""
    rng = random.Random(seed)
    return [
        (int(rng.uniform(0.25e9, 0.35e9)), rng.uniform(2, 4), rng.uniform(3, 6))
        for _ in range(count)
    ]


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


def run_session(group: Path, session: tuple[int, float, float]) -> int:
    size, grow, hold = session
    argv = in_group(group, [sys.executable, "-c", GROW, str(size), str(grow), str(hold)])
    return subprocess.run(argv, check=False).returncode


def hook_contender(group: Path, work: list[tuple[int, float, float]], memory: str) -> list[int]:
    """Every session at once through the hook; each session's exit status."""
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
            codes = [0] * len(work)

            def one(i: int) -> None:
                pre = {
                    "session_id": f"bench-{i}",
                    "hook_event_name": "PreToolUse",
                    "tool_name": "Agent",
                    "tool_input": {"subagent_type": "general-purpose", "prompt": "p"},
                    "tool_use_id": f"toolu_bench{i}",
                }
                hook = [sys.executable, "-m", "roomkeeper", "hook", "claude-code", "--memory"]
                said = subprocess.run(
                    [*hook, memory],
                    input=json.dumps(pre),
                    env=hook_env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if said.returncode != 0 or said.stdout.strip():
                    codes[i] = -1000  # refused: lost
                    return
                codes[i] = run_session(group, work[i])
                post = json.dumps({**pre, "hook_event_name": "PostToolUse"})
                subprocess.run(
                    hook[:-1], input=post, env=hook_env, capture_output=True, text=True, check=False
                )

            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return codes
        finally:
            stop_process(gateway)


def cap_contender(group: Path, work: list[tuple[int, float, float]], cap: int) -> list[int]:
    """At most ``cap`` sessions at once; each session's exit status."""
    slots = threading.Semaphore(cap)
    codes = [0] * len(work)

    def one(i: int) -> None:
        with slots:
            codes[i] = run_session(group, work[i])

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
    parser.add_argument("--contenders", default="hook,20,4")
    parser.add_argument("--memory", default="400M", help="the hook's stated estimate")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    parent, version = Path(own.directory), own.version
    limit = parse_size(args.limit)
    work = sessions(args.seed, args.sessions)
    print(
        f"cgroup v{version}, limit {limit / 1e9:.2f} GB, {len(work)} sessions of "
        f"{min(w[0] for w in work) / 1e9:.2f}..{max(w[0] for w in work) / 1e9:.2f} GB "
        f"(seed {args.seed})",
        flush=True,
    )
    for name in (c.strip() for c in args.contenders.split(",") if c.strip()):
        with memory_group(parent, version, limit) as group:
            started = time.monotonic()
            if name == "hook":
                codes = hook_contender(group, work, args.memory)
                label = f"hook (--memory {args.memory})"
            elif name.isdigit():
                codes = cap_contender(group, work, int(name))
                label = f"count cap {name}"
            else:
                sys.exit(f"unknown contender {name!r}: give hook or a number")
            wall = time.monotonic() - started
            kills = group_oom_kills(group, version)
        done = sum(1 for c in codes if c == 0)
        print(
            f"{label:24s} done {done:2d}/{len(work)}  lost {len(work) - done:2d}  "
            f"OOM kills {kills:2d}  all finished in {wall:6.1f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
