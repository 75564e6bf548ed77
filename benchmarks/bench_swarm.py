"""Memory swarm: roomkeeper batch against GNU parallel in a real memory cgroup.

The held-out swarm: 20 jobs each grow to a different size between 300 MB and
1.15 GB over a few seconds and hold it briefly, in a 3.5 GiB group.  Every
contender runs in a fresh child memory cgroup (v1 or v2, created under this
process's own group, removed after) and is judged by completed jobs, kernel
OOM kills (the group's counter and, on v1 where a kill counts only in the
victim's own group, the kernel's /proc/vmstat) and wall time:

- (a) ``roomkeeper batch --max-running 8``: no ``--job-memory``, memory policy
  ``pack``, nothing learned yet (each line names its kind, ``#kind=``);
- (b) the same batch again, learning from (a) (same ROOMKEEPER_HOME);
- (c) ``roomkeeper batch --strict --job-memory 75M``: every estimate at least 4x
  too small (the smallest job is 300 MB), under the old rule;
- (d) for each roomkeeper run, the relief ladder's counts (holds, suspensions,
  stops, re-runs) and reaction time p50 and max, from the batch's summary;
- ``parallel --memfree 1150M -j 8`` (reads the host's /proc/meminfo);
- ``parallel -j K`` for K in ``--k``: the best K that loses no job is the bar.

Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_swarm.py [--limit 3.5G] [--jobs 20] [--max-size 1150M]
        [--grow 3] [--hold 1] [--start-delay 0] [--k 2,3,4,5,6] [--only-roomkeeper]

``--start-delay S`` makes every job idle S seconds before it grows (a slow
start, as imports give): what the packing forecast must not mistake for a
small job.

The scorecard, ``--seeds N [--first-seed S]``: N seeded random swarms of
``swarmgen.py`` (work nobody has seen: a fresh ROOMKEEPER_HOME each, no sizes
given), each in a group of its own drawn size.  On each, ``roomkeeper batch``
with no count (memory and the cores decide how many run; ``--max-running N``
gives it one) and ``parallel -j K`` for K = 3, 4, ... up to the first K that
loses a job (2 only where 3 loses one; every job at once at most).  Per swarm: roomkeeper's
wall against the fastest K that lost nothing, against the swarm's
memory-time bound, and OOM kills and lost jobs for everyone; every
contender's memory slack (``slack.py``: the time-averaged share of the line
left unused while jobs waited to start); then the distribution over the
seeds.  ``--keep DIR`` keeps each roomkeeper run's stderr (its admission and
relief log lines); ``--only-roomkeeper`` leaves the sweep out; ``--from-k K`` starts it at
K (to measure again only the Ks from there, where an earlier sweep stopped short; where K
loses a job, the sweep goes down from it) and ``--to-k K`` ends it at K; ``--repeat N`` runs
each K N times, and a K is safe only when none of its runs lost a job (a K whose jobs' peaks
happened not to meet in one run is not safe), its wall the median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench_ladder import machine_oom_kills, oom_kills  # one reader of the counters
from groups import end_on_sigterm, remove_group
from slack import SlackMeter
from swarmgen import Swarm, generate

from roomkeeper.guard.rule import memory_line
from roomkeeper.kernel.job_cgroups import job_cgroup_parent
from roomkeeper.units import parse_size

HERE = Path(__file__).resolve().parent
GROW = HERE / "grow.py"
SMALLEST = 300_000_000


def pressure_figures(stderr_text: str) -> str:
    """(d): the relief ladder's counts and reaction times, from ``roomkeeper batch``'s summary.

    The batch prints ``memory pressure: holds N, suspensions N, stops N, re-runs N,
    reaction p50 X ms, max Y ms`` (:func:`roomkeeper.cli.batch_view.pressure_line`).
    """
    for line in stderr_text.splitlines():
        if line.startswith("memory pressure: holds"):
            return line.removeprefix("memory pressure: ")
    return "no pressure line in roomkeeper batch's summary"


def run_in_group(
    parent: Path,
    version: int,
    limit: int,
    argv: list[str],
    stdin: Path,
    stderr: Path | None = None,
    measure: Callable[[Path], None] | None = None,
    slack: SlackMeter | None = None,
) -> tuple[float, int]:
    """Run argv inside a fresh child group with ``limit``; return (wall seconds, OOM kills).

    ``stderr``, when given, receives the contender's stderr (the batch's summary);
    ``measure``, when given, is handed the group once the contender has ended;
    ``slack``, when given, samples the group while the contender runs.
    The kills are the larger of the group's own counter and the kernel-wide delta.
    """
    group = parent / f"rkbench-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
        if version == 1:
            with contextlib.suppress(OSError):  # no swap here; keep it that way if swap exists
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
        joiner = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        before = machine_oom_kills()
        start = time.monotonic()
        if slack is not None:
            slack.start(group)
        with stdin.open() as f, contextlib.ExitStack() as stack:
            err = stack.enter_context(stderr.open("w")) if stderr else subprocess.DEVNULL
            contender = subprocess.Popen(
                joiner + argv, stdin=f, stdout=subprocess.DEVNULL, stderr=err
            )
            try:
                contender.wait()
            except BaseException:  # stopped (Ctrl-C, a timeout's SIGTERM): as Ctrl-C stops it
                _interrupt(contender)
                raise
        wall = time.monotonic() - start
        if slack is not None:
            slack.stop()
        if measure is not None:  # the group's own counters, before it is removed
            measure(group)
        return wall, max(oom_kills(group, version), machine_oom_kills() - before)
    finally:
        _remove_group(group)


def _remove_group(group: Path) -> None:
    """Remove ``group`` (:func:`groups.remove_group`) once what the contender left in it has
    had 10 s to end on its own: a killed batch's lifeline removes its jobs' groups, freezer
    groups included, and exits."""
    settle = time.monotonic() + 10
    while time.monotonic() < settle and _has_members(group):
        time.sleep(0.1)
    stuck = remove_group(group)
    if stuck:
        raise OSError(f"could not remove {', '.join(map(str, stuck))}")


def _has_members(group: Path) -> bool:
    """Whether any process is left in ``group`` or its children; a child group removed while
    it is read (the lifeline removes its jobs' groups meanwhile) has none."""
    for directory, _, _ in os.walk(group):  # a directory gone meanwhile is skipped
        try:
            if Path(directory, "cgroup.procs").read_text().split():
                return True
        except FileNotFoundError:
            continue
    return False


def _interrupt(contender: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """Stop the contender as Ctrl-C does (roomkeeper stops its jobs' trees and removes their
    groups), SIGKILL after ``grace_s``.  A Ctrl-C at the terminal reached it already (it is
    in our process group), and so does a timeout's signal: it gets a moment first, since
    roomkeeper takes a second SIGINT as "exit now"."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        contender.wait(timeout=2.0)
        return
    with contextlib.suppress(ProcessLookupError):
        contender.send_signal(signal.SIGINT)
    try:
        contender.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        contender.kill()
        contender.wait()


@dataclass(frozen=True, slots=True)
class SwarmRun:
    """How one contender ran one swarm.

    Attributes:
        slack: the share of the line left unused while jobs waited to start (None: none
            waited).
        highest: the most its group was seen using, as a share of the group's limit.
    """

    wall: float
    kills: int
    lost: int
    stderr: str
    slack: float | None
    highest: float

    def figures(self) -> str:
        """Wall, OOM kills, lost jobs, slack and highest use, in one line's words."""
        return (
            f"wall {self.wall:6.1f} s  OOM kills {self.kills}  lost {self.lost}  "
            f"slack {percent(self.slack)}  highest use {100 * self.highest:.0f} % of the limit"
        )


def run_swarm(
    swarm: Swarm,
    argv: list[str],
    parent: Path,
    version: int,
    tmp: Path,
    name: str,
    env: dict[str, str] | None = None,
) -> SwarmRun:
    """One contender on ``swarm`` in a fresh group."""
    done = tmp / f"done-{name}"
    done.mkdir(parents=True)
    commands = tmp / f"{name}.txt"
    commands.write_text(
        "".join(job.command(str(done / str(i))) + "\n" for i, job in enumerate(swarm.jobs))
    )
    err = tmp / f"{name}.err"
    saved = dict(os.environ)
    os.environ.update(env or {})
    meter = SlackMeter(len(swarm.jobs), memory_line(swarm.limit, 10.0), version)
    try:
        wall, kills = run_in_group(parent, version, swarm.limit, argv, commands, err, slack=meter)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    lost = len(swarm.jobs) - len(list(done.iterdir()))
    slack = meter.stop()
    return SwarmRun(wall, kills, lost, err.read_text(), slack, meter.highest / swarm.limit)


def sweep(
    swarm: Swarm,
    parent: Path,
    version: int,
    tmp: Path,
    first: int = 3,
    *,
    last: int | None = None,
    repeat: int = 1,
) -> tuple[dict[int, float], dict[int, float | None]]:
    """``parallel -j K`` from K = ``first`` (3) up to the first K that loses a job (at most
    every job at once, or ``last``); where ``first`` itself loses one, down from it until a K
    loses nothing (2 at the least: 2 is never faster than a 3 that loses nothing).  Each K
    runs ``repeat`` times (:func:`run_k`).  The walls of the safe Ks, and every K's slack.  A
    later ``first`` measures again only the Ks from there (those below were measured
    before), unless it loses a job."""
    safe: dict[int, float] = {}
    slacks: dict[int, float | None] = {}

    def run(k: int) -> bool:
        wall, slacks[k] = run_k(swarm, k, repeat, parent, version, tmp)
        if wall is not None:
            safe[k] = wall
        return wall is not None

    top = len(swarm.jobs) if last is None else min(last, len(swarm.jobs))
    if first > top:
        print(f"  the sweep's highest K is {top}, below --from-k: no K run", flush=True)
        return safe, slacks
    if not run(first):
        for k in range(first - 1, 1, -1):
            if run(k):
                break
        return safe, slacks
    for k in range(first + 1, top + 1):
        if not run(k):
            break
    return safe, slacks


def run_k(
    swarm: Swarm, k: int, repeat: int, parent: Path, version: int, tmp: Path
) -> tuple[float | None, float | None]:
    """``parallel -j k`` ``repeat`` times, stopping at a run that loses a job: (the median
    wall, None when a run lost a job; the median slack, None when no job waited)."""
    walls: list[float] = []
    shares: list[float] = []
    for run in range(repeat):
        name = f"j{k}" if run == 0 else f"j{k}.{run + 1}"  # each run's own done files
        result = run_swarm(swarm, ["parallel", "-j", str(k)], parent, version, tmp, name)
        print(f"  parallel -j {k}: {result.figures()}", flush=True)
        if result.slack is not None:
            shares.append(result.slack)
        if result.kills or result.lost:
            return None, result.slack
        walls.append(result.wall)
    return statistics.median(walls), statistics.median(shares) if shares else None


def batch_argv(count: int | None) -> list[str]:
    """``roomkeeper batch``, quiet, with ``--max-running count`` when a count is given."""
    argv = [sys.executable, "-m", "roomkeeper", "batch", "--quiet"]
    return argv if count is None else [*argv, "--max-running", str(count)]


def percent(share: float | None) -> str:
    """A slack in words: a percentage, or why there is none."""
    return "-- (no job waited)" if share is None else f"{100 * share:.0f} %"


def scorecard(
    seeds: list[int],
    parent: Path,
    version: int,
    keep: Path | None,
    *,
    sweep_k: bool = True,
    count: int | None = None,
    first_k: int = 3,
    last_k: int | None = None,
    repeat: int = 1,
) -> None:
    """Roomkeeper (``count``: its --max-running, none by default) against a sweep of static K
    on each seeded swarm (:func:`sweep`); the distribution."""
    ratios, bounds, rk_kills, rk_lost = [], [], 0, 0
    among = _bars_from(first_k, last_k, repeat)
    rk_slacks: list[float] = []
    best_slacks: list[float] = []  # the fastest safe K's, per swarm
    for seed in seeds:
        swarm = generate(seed)
        print(swarm.describe(), flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            tmpdir = Path(tmp)
            rk = batch_argv(count)
            env = {"ROOMKEEPER_HOME": str(tmpdir / "home")}
            result = run_swarm(swarm, rk, parent, version, tmpdir, "rk", env)
            wall = result.wall
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"seed-{seed}.err").write_text(result.stderr)
            rk_kills, rk_lost = rk_kills + result.kills, rk_lost + result.lost
            print(
                f"  roomkeeper batch: {result.figures()}  ({pressure_figures(result.stderr)})",
                flush=True,
            )
            if result.slack is not None:
                rk_slacks.append(result.slack)
            safe, slacks = (
                sweep(swarm, parent, version, tmpdir, first_k, last=last_k, repeat=repeat)
                if sweep_k
                else ({}, {})
            )
        if not safe:
            if sweep_k:
                print("  no K run lost nothing: no ratio for this swarm", flush=True)
            continue
        best = min(safe, key=lambda k: safe[k])
        ratio, bound = wall / safe[best], wall / swarm.bound_s()
        best_slack = slacks.get(best)
        if best_slack is not None:
            best_slacks.append(best_slack)
        ratios.append(ratio)
        bounds.append(bound)
        print(
            f"  seed {seed}: roomkeeper / fastest safe K{among} (-j {best}, {safe[best]:.1f} s) = "
            f"{ratio:.2f}x; roomkeeper / memory-time bound ({swarm.bound_s():.1f} s) = "
            f"{bound:.2f}x",
            flush=True,
        )
    if ratios:
        print(
            f"over {len(ratios)} swarms: roomkeeper / fastest safe K{among}: median "
            f"{statistics.median(ratios):.2f}x, max {max(ratios):.2f}x, above 1.0x: "
            f"{sum(1 for r in ratios if r > 1.0)}; sorted "
            f"{', '.join(f'{r:.2f}' for r in sorted(ratios))}"
        )
        print(
            f"roomkeeper / memory-time bound: median {statistics.median(bounds):.2f}x, sorted "
            f"{', '.join(f'{b:.2f}' for b in sorted(bounds))}"
        )
    if rk_slacks:
        print(f"roomkeeper's memory slack: median {percent(statistics.median(rk_slacks))}")
    if best_slacks:
        print(
            f"the fastest safe K's memory slack: median {percent(statistics.median(best_slacks))}"
        )
    print(f"roomkeeper in all: OOM kills {rk_kills}, lost jobs {rk_lost}")


def _bars_from(first_k: int, last_k: int | None, repeat: int) -> str:
    """What the bars were taken from, in words after "fastest safe K" (nothing for a whole
    sweep run once)."""
    among = "" if first_k <= 3 and last_k is None else " of the Ks run"
    return among + (f" (safe in each of {repeat} runs)" if repeat > 1 else "")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", default="3.5G", help="the group's limit (binary suffixes)")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--max-size", default="1150M", help="the largest job's peak")
    parser.add_argument("--grow", type=float, default=3.0, help="seconds each job takes to grow")
    parser.add_argument("--hold", type=float, default=1.0, help="seconds each job holds its peak")
    parser.add_argument(
        "--start-delay", type=float, default=0.0, help="seconds each job idles before growing"
    )
    parser.add_argument("--k", default="2,3,4,5,6", help="parallel -j values to try")
    parser.add_argument(
        "--only-roomkeeper", action="store_true", help="run the roomkeeper contenders only"
    )
    parser.add_argument(
        "--skip", default="", help="roomkeeper contenders to leave out, by letter (say: c)"
    )
    parser.add_argument("--seeds", type=int, default=0, help="the scorecard: this many swarms")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep each scorecard run's stderr here")
    parser.add_argument(
        "--max-running",
        type=int,
        help="the scorecard: give roomkeeper this count (none by default: memory and the cores "
        "decide)",
    )
    parser.add_argument(
        "--from-k",
        type=int,
        default=3,
        help="the scorecard: start the sweep at this K (the Ks below it measured before; "
        "where it loses a job, the sweep goes down from it)",
    )
    parser.add_argument(
        "--to-k", type=int, help="the scorecard: go no higher than this K (default: every job)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="the scorecard: run each K this many times; it is safe when none lost a job",
    )
    args = parser.parse_args()
    if args.from_k < 3:
        parser.error("--from-k must be 3 or more (the sweep itself runs K = 2 where 3 loses)")
    if args.to_k is not None and args.to_k < args.from_k:
        parser.error(
            f"--to-k ({args.to_k}) is below --from-k ({args.from_k}): give one at or above it"
        )
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    return args


def bench_groups() -> tuple[Path, int]:
    """Where the benchmarks' groups go (this process's own group) and its cgroup version;
    a clear exit without GNU parallel, root or a memory controller."""
    if shutil.which("parallel") is None:
        sys.exit("GNU parallel is needed: apt-get install -y parallel")
    own = job_cgroup_parent()
    if own is None or os.geteuid() != 0:
        sys.exit("needs root and a cgroup memory controller")
    return Path(own.directory), own.version


def main() -> None:
    args = parse_args()
    parent, version = bench_groups()
    # A timeout's SIGTERM must still run the finally that removes the contender's group.
    signal.signal(signal.SIGTERM, end_on_sigterm)
    if args.seeds:
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        scorecard(
            seeds,
            parent,
            version,
            args.keep,
            sweep_k=not args.only_roomkeeper,
            count=args.max_running,
            first_k=args.from_k,
            last_k=args.to_k,
            repeat=args.repeat,
        )
        return
    limit = parse_size(args.limit)
    largest = parse_size(args.max_size)
    sizes = [int(SMALLEST + i * (largest - SMALLEST) / (args.jobs - 1)) for i in range(args.jobs)]
    random.Random(7).shuffle(sizes)
    too_small = f"{SMALLEST // 4 // 1_000_000}M"
    print(
        f"cgroup v{version}, limit {limit} bytes, {args.jobs} jobs of {SMALLEST / 1e9:.2f}.."
        f"{largest / 1e9:.2f} GB, line {memory_line(limit, 10)} bytes",
        flush=True,
    )

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        rk = [sys.executable, "-m", "roomkeeper", "batch", "--max-running", "8", "--quiet"]
        contenders: list[tuple[str, list[str]]] = [
            ("(a) roomkeeper batch, learning", rk),
            ("(b) roomkeeper batch, learned", rk),
            (
                f"(c) roomkeeper batch --strict --job-memory {too_small}",
                [*rk, "--strict", "--job-memory", too_small],
            ),
        ]
        skipped = {f"({x.strip()})" for x in args.skip.split(",") if x.strip()}
        contenders = [c for c in contenders if c[0].split()[0] not in skipped]
        if not args.only_roomkeeper:
            contenders += [
                (
                    f"parallel --memfree {args.max_size} -j 8",
                    ["parallel", "--memfree", args.max_size, "-j", "8"],
                )
            ] + [
                (f"parallel -j {k}", ["parallel", "-j", str(k)])
                for k in map(int, args.k.split(","))
            ]
        env_home = tmpdir / "home"  # the journal (learned sizes) and every batch's logs
        os.environ["ROOMKEEPER_HOME"] = str(env_home)
        for name, argv in contenders:
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)  # shell text: no ( ) or ,
            done = tmpdir / "done" / slug
            done.mkdir(parents=True)
            commands = tmpdir / f"{slug}.txt"
            # The learning runs name each line's kind, so run 2 learns run 1's peaks
            # although the lines' done files differ.
            kinds = "learn" in name
            commands.write_text(
                "".join(
                    f"{sys.executable} {GROW} {size} {args.grow} {args.hold} {done / str(i)}"
                    + (f" {args.start_delay}" if args.start_delay else "")
                    + (f" #kind=swarm-{i}" if kinds else "")
                    + "\n"
                    for i, size in enumerate(sizes)
                )
            )
            err = tmpdir / f"{slug}.err" if "roomkeeper" in name else None
            wall, kills = run_in_group(parent, version, limit, argv, commands, err)
            completed = len(list(done.iterdir()))
            rows.append((name, completed, kills, wall))
            print(
                f"{name:34s} completed {completed:2d}/{args.jobs}  OOM kills {kills:2d}  "
                f"wall {wall:6.1f} s",
                flush=True,
            )
            if err is not None:
                print(f"  (d) {pressure_figures(err.read_text())}", flush=True)

    report(rows, args.jobs)


def report(rows: list[tuple[str, int, int, float]], jobs: int) -> None:
    """The best static K that loses no job, and each roomkeeper run's wall against it."""
    safe = {
        int(n.split()[-1]): w
        for n, c, k, w in rows
        if n.startswith("parallel -j") and k == 0 and c == jobs
    }
    best = max(safe) if safe else None
    print(f"best K with every job done and no OOM kill: {best if best else 'none'}")
    for name, _, _, wall in rows:
        if "roomkeeper" in name and best is not None:
            print(f"{name} wall / parallel -j {best} wall = {wall / safe[best]:.2f}x")


if __name__ == "__main__":
    main()
