"""A Ray cluster under memory pressure: roomkeeper's Ray backend against plain Ray tasks.

Starts a local Ray cluster on loopback (``local_ray.py`` beside this file): a
head with no CPUs and three worker nodes of 2 CPUs and a memory resource of
600 MB (``--node-memory``), each ``ray start`` inside its own memory cgroup
of 1 GiB (v1 or v2, made where roomkeeper makes job groups, removed
afterwards even on failure).  Every contender gets a fresh
cluster and fresh groups, so a kill in one run cannot leave a node short for
the next.  The swarm: nine jobs stating 120 MB each and growing to 260-460 MB
(2-4x: 20 equal steps over 3 s, then 3 s held, as ``grow.py`` does), half a
CPU each, so Ray, which books only what is stated, packs several on a node
and any two of them outgrow it.  The contenders:

- ``roomkeeper``: a gateway with ROOMKEEPER_BACKEND=ray, node monitors on,
  no per-owner share below the swarm (plain Ray has none), every job
  ``python grow.py SIZE 3 3`` stating 120 MB, restartable; nodes started with
  RAY_memory_usage_threshold=0.99, as the README says.
- ``ray-stated``: plain Ray tasks that grow in the task itself, ``memory=``
  the stated 120 MB, ``num_cpus=0.5``; Ray's defaults (its memory monitor at
  0.95, its retries).
- ``ray-oracle``: the same with ``memory=`` each task's true size.

For each: the wall time from the first submission until every job has
ended; the OOM kills each node's group counted (``memory.oom_control`` or
``memory.events``, read per group; on cgroup v1 a kill inside a job's own
group under a node's counts only there, so the kernel-wide delta of
``/proc/vmstat`` is printed beside it, an upper bound); tasks killed by
Ray's memory monitor (an ``OutOfMemoryError`` as the task's result, or as the
loss the gateway logs); and tasks lost (not ended successfully).  A
contender whose tasks have not all ended after ``--timeout`` seconds (a
killed task retried without end) is cut off there and said to be.

Needs root and a cgroup memory controller.  Usage (from the repository root):
    PYTHONPATH=src python benchmarks/bench_cluster_pressure.py \\
        [--runs 1] [--contenders roomkeeper,ray-stated,ray-oracle] [--timeout 300] \\
        [--node-memory 600000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groups import remove_group
from live_gateway import RunningGateway, running_gateway
from local_ray import local_cluster

from roomkeeper.kernel.delegation import prepare_job_groups
from roomkeeper.kernel.oom_kills import group_oom_kills, machine_oom_kills

MB = 1_000_000
GIB = 1 << 30
NODES = ("n1", "n2", "n3")
ESTIMATE = 120 * MB
# True sizes, 2-4x the estimate.  Ray's own processes hold about 0.4 GB of each node's
# 1 GiB, so each job fits a node alone, and any two together outgrow it.
SIZES = [s * MB for s in (300, 380, 440, 260, 400, 460, 320, 420, 350)]
GROW_S, HOLD_S, STEPS = 3.0, 3.0, 20
JOB_CPUS = 0.5
# The memory resource each node offers Ray: its 1 GiB less what Ray's own processes and
# idle workers hold there (about 170 MB before any task, 0.4 GB with its workers busy), so
# that the oracle's bookings at the true sizes really fit.  Offered the whole GiB, the
# oracle packs two of the largest on a node and the kernel kills.
NODE_MEMORY = 600 * MB
GROW = Path(__file__).resolve().parent / "grow.py"
CONTENDERS = ("roomkeeper", "ray-stated", "ray-oracle")
FINAL = {"exited", "failed", "stopped", "uncertain", "cancelled", "timed_out", "expired"}


@dataclass(frozen=True, slots=True)
class Outcome:
    """One contender's run: wall seconds, kills by kind, tasks lost, and whether it was cut off."""

    wall_s: float
    group_kills: int
    machine_kills: int
    ray_kills: int
    lost: int
    timed_out: bool
    note: str = ""


# ------------------------------------------------------------------ groups


def group_place() -> tuple[int, Path]:
    """(cgroup version, the folder the node groups go in); a clear exit without one."""
    if os.geteuid() != 0:
        sys.exit("needs root: each node is started in a memory cgroup made for it")
    place = prepare_job_groups()
    if place.directory is None or place.version is None:
        sys.exit(f"no memory cgroup can be made here: {place.reason}")
    return place.version, Path(place.directory)


@contextlib.contextmanager
def node_groups(version: int, folder: Path) -> Iterator[dict[str, Path]]:
    """One fresh 1 GiB group per node; removed afterwards, whatever is still in them killed."""
    made: dict[str, Path] = {}
    try:
        for name in NODES:
            group = folder / f"rkbench-{name}-{uuid.uuid4().hex[:8]}"
            group.mkdir()
            made[name] = group
            (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(
                str(GIB)
            )
            if version == 1:
                with contextlib.suppress(OSError):  # no swap here; keep it so if there is
                    (group / "memory.memsw.limit_in_bytes").write_text(str(GIB))
        yield made
    finally:
        for group in made.values():
            for directory in remove_group(group):
                print(f"could not remove {directory}", file=sys.stderr)


def held_mb(version: int, groups: dict[str, Path]) -> str:
    """What each node group holds now, MB (Ray's own processes, before any job)."""
    name = "memory.current" if version == 2 else "memory.usage_in_bytes"
    return "/".join(str(int((g / name).read_text()) // MB) for g in groups.values())


def kills_now(version: int, groups: dict[str, Path]) -> int:
    """The OOM kills the node groups have counted, all together."""
    return sum(group_oom_kills(g, version) for g in groups.values())


# ------------------------------------------------------------------ roomkeeper


def run_roomkeeper(address: str, tmp: Path, timeout_s: float) -> tuple[float, int, int, bool, str]:
    """The swarm through a gateway: (wall, Ray kills, lost, cut off, the pressure acts)."""
    with running_gateway(
        tmp,
        ROOMKEEPER_BACKEND="ray",
        ROOMKEEPER_RAY_ADDRESS=address,
        ROOMKEEPER_RAY_JOB_CPUS=str(JOB_CPUS),
        ROOMKEEPER_MAX_RUNNING="16",
        # One owner submits all nine, and plain Ray has no per-owner share: without these
        # the gateway's default fair share (2 running per owner) would run two at a time.
        ROOMKEEPER_MAX_RUNNING_PER_OWNER="16",
        ROOMKEEPER_MAX_WAITING_PER_OWNER="16",
        ROOMKEEPER_RAY_NODE_MONITORS="on",
    ) as gw:
        wait_for(lambda: monitors_ready(gw), "every node's monitor to start", 120)
        start = time.monotonic()
        ids = [submit(gw, size) for size in SIZES]
        ends: dict[str, dict[str, Any]] = {}
        while len(ends) < len(ids) and time.monotonic() - start < timeout_s:
            for job_id in ids:
                if job_id not in ends:
                    view = dict(gw.client.get(f"/v1/jobs/{job_id}").json())
                    if view["state"] in FINAL:
                        ends[job_id] = view
            time.sleep(0.1)
        wall = time.monotonic() - start
        history = gw.client.get("/v1/history").json()
        views = [ends.get(i) or gw.client.get(f"/v1/jobs/{i}").json() for i in ids]
        (tmp / "jobs.json").write_text(json.dumps(views, indent=1))
        (tmp / "history.json").write_text(json.dumps(history, indent=1))
    log_text = "".join(p.read_text(errors="replace") for p in tmp.glob("gateway-*.log"))
    ray_kills = log_text.count("OutOfMemoryError")
    lost = len(ids) - sum(1 for v in ends.values() if (v["state"], v["exit_code"]) == ("exited", 0))
    acts: dict[str, int] = {}
    for event in history:
        if event["code"].startswith("pressure_"):
            acts[event["code"]] = acts.get(event["code"], 0) + 1
    reruns = sum(1 for v in ends.values() if v.get("estimate_source") == "re-run")
    note = ", ".join(f"{k.removeprefix('pressure_')} {v}" for k, v in sorted(acts.items()))
    return wall, ray_kills, lost, len(ends) < len(ids), f"{note}; re-run jobs {reruns}"


def monitors_ready(gw: RunningGateway) -> bool:
    """Three worker nodes joined and none held for a monitor still starting."""
    nodes = feed(gw)
    workers = [n for n in nodes if n["alive"] and n["cpus"] > 0]
    return len(workers) == len(NODES) and not any(n["held"] for n in workers)


def feed(gw: RunningGateway) -> list[dict[str, Any]]:
    """The nodes as the gateway's feed shows them."""
    return list(gw.client.get("/v1/feed").json()["nodes"])


def submit(gw: RunningGateway, size: int) -> str:
    argv = [sys.executable, str(GROW), str(size), str(GROW_S), str(HOLD_S), "-", "0", str(STEPS)]
    body = {"argv": argv, "memory_bytes": ESTIMATE, "restartable": True}
    answer = gw.client.post("/v1/jobs", json=body)
    if answer.status_code != 201:
        raise SystemExit(f"the gateway refused a job: {answer.status_code} {answer.text}")
    return str(answer.json()["id"])


def wait_for(ready: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what} ({timeout_s:g} s)")
        time.sleep(0.2)


# ------------------------------------------------------------------ plain Ray


def grow_in_task(size: int) -> int:
    """A plain Ray task's body: grow to ``size`` bytes as grow.py does, hold, end."""
    held = []
    for _ in range(STEPS):
        held.append(b"\x01" * (size // STEPS))  # written: every page is charged
        time.sleep(GROW_S / STEPS)
    time.sleep(HOLD_S)
    return len(held)


def run_plain_ray(
    address: str, oracle: bool, timeout_s: float
) -> tuple[float, int, int, bool, str]:
    """The swarm as plain Ray tasks: (wall, Ray kills, lost, cut off, the other errors)."""
    import ray  # only the plain-Ray contenders need it in this process

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        ray.get(ray.remote(num_cpus=JOB_CPUS)(lambda: None).remote())  # workers up
        start = time.monotonic()
        refs = [
            ray.remote(num_cpus=JOB_CPUS, memory=size if oracle else ESTIMATE)(grow_in_task).remote(
                size
            )
            for size in SIZES
        ]
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        wall = time.monotonic() - start
        kinds: dict[str, int] = {}
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as err:
                kinds[type(err).__name__] = kinds.get(type(err).__name__, 0) + 1
        for ref in pending:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        ray_kills = kinds.get("OutOfMemoryError", 0)
        lost = sum(kinds.values()) + len(pending)
        note = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "no errors"
        return wall, ray_kills, lost, bool(pending), note
    finally:
        ray.shutdown()


# ------------------------------------------------------------------ the runs


def run_one(
    name: str, version: int, folder: Path, timeout_s: float, node_memory: int, keep: Path | None
) -> Outcome:
    """One contender on a fresh cluster in fresh groups."""
    env = {"RAY_memory_usage_threshold": "0.99"} if name == "roomkeeper" else {}
    with (
        node_groups(version, folder) as groups,
        local_cluster(dict.fromkeys(NODES, node_memory), groups=groups, env=env) as cluster,
        tempfile.TemporaryDirectory(prefix="rk-bench-") as tmp,
    ):
        before, machine_before = kills_now(version, groups), machine_oom_kills()
        print(f"  {name}: the node groups hold {held_mb(version, groups)} MB before", flush=True)
        if name == "roomkeeper":
            wall, ray_kills, lost, cut, note = run_roomkeeper(cluster.address, Path(tmp), timeout_s)
        else:
            # Ray's driver prints its workers' deaths on stdout: to stderr, beside the figures.
            with contextlib.redirect_stdout(sys.stderr):
                wall, ray_kills, lost, cut, note = run_plain_ray(
                    cluster.address, name == "ray-oracle", timeout_s
                )
        if keep is not None:  # the gateway's log, to read why (the folder goes with the run)
            keep.mkdir(parents=True, exist_ok=True)
            for log in [*Path(tmp).glob("gateway-*.log"), *Path(tmp).glob("*.json")]:
                shutil.copy(log, keep / f"{name}-{log.name}")
        return Outcome(
            wall_s=wall,
            group_kills=kills_now(version, groups) - before,
            machine_kills=machine_oom_kills() - machine_before,
            ray_kills=ray_kills,
            lost=lost,
            timed_out=cut,
            note=note,
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each contender")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, of {', '.join(CONTENDERS)}",
    )
    parser.add_argument(
        "--node-memory",
        type=int,
        default=NODE_MEMORY,
        help="the memory resource (bytes) each node offers Ray's placement",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a contender is cut off"
    )
    parser.add_argument("--keep", type=Path, help="copy each run's gateway log here")
    args = parser.parse_args()
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in args.contenders if c not in CONTENDERS]
    if unknown or args.runs < 1:
        parser.error(f"contenders are {', '.join(CONTENDERS)} (got {unknown}); --runs >= 1")
    return args


def main() -> None:
    args = parse_args()
    version, folder = group_place()
    print(
        f"3 nodes of 2 CPUs, each in its own cgroup v{version} group of 1 GiB; 9 jobs stating "
        f"{ESTIMATE // MB} MB, growing to {min(SIZES) // MB}-{max(SIZES) // MB} MB "
        f"over {GROW_S:g} s, held {HOLD_S:g} s, {JOB_CPUS:g} CPU each; {args.runs} run(s); "
        f"each node offers Ray {args.node_memory // MB} MB"
    )
    print(
        "roomkeeper: nodes at RAY_memory_usage_threshold=0.99, node monitors on; "
        "ray-stated, ray-oracle: Ray's defaults (threshold 0.95, its retries)"
    )
    walls: dict[str, float] = {}
    for name in args.contenders:
        outcomes = [
            run_one(name, version, folder, args.timeout, args.node_memory, args.keep)
            for _ in range(args.runs)
        ]
        walls[name] = statistics.median(o.wall_s for o in outcomes)
        cut = sum(o.timed_out for o in outcomes)
        print(
            f"{name:<11} wall {walls[name]:6.1f} s"
            f"{' (cut off at the timeout in ' + str(cut) + ' run(s))' if cut else ''}"
            f"  OOM kills in node groups {sum(o.group_kills for o in outcomes)}"
            f" (machine-wide {sum(o.machine_kills for o in outcomes)})"
            f"  killed by Ray {sum(o.ray_kills for o in outcomes)}"
            f"  lost {sum(o.lost for o in outcomes)}/{9 * args.runs}"
            f"  [{'; '.join(o.note for o in outcomes)}]",
            flush=True,
        )
    if "roomkeeper" in walls and "ray-oracle" in walls:
        ratio = walls["roomkeeper"] / walls["ray-oracle"]
        print(f"roomkeeper's wall / the oracle's: {ratio:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
