"""Agent turns: jobs that grow slowly to about 0.85 GB and hold it for a long turn.

A time-compressed agent session: each of 30 jobs grows steadily to 0.75..0.95
GB over 20..60 s and then holds it 60..180 s (drawn once with a fixed seed),
in a 6 GiB memory group.  Contenders, each in a fresh group of its own:

- ``pack``: ``roomkeeper batch``, no sizes and no count given (memory and the
  cores decide how many run; ``--max-running N`` gives it one);
- ``strict``: the same with ``--strict`` and the default estimate, a fixed
  reservation per young job for its warm-up window (what a dispatcher without
  measurements would do);
- ``K`` (a number): ``parallel -j K``, a static worker count.

Reported per contender: jobs done per minute, the group's peak memory used
(v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``), OOM kills, lost jobs.

Needs root and a cgroup memory controller.  Usage:
    python benchmarks/bench_agent_turns.py [--contenders pack,strict,5,6,7] [--jobs 30]
        [--limit 6G] [--seed 1] [--max-running N] [--keep DIR]

``--keep DIR`` keeps each roomkeeper run's stderr (its admission and relief log
lines, the summary) as ``DIR/agent-turns-CONTENDER.err``.

``--learned-from SEED`` measures roomkeeper after an earlier session: before
each roomkeeper run, a batch of ``--learn-turns`` turns drawn with SEED (other
sizes and times, so other command lines of the same program) runs unmeasured
in the same ROOMKEEPER_HOME, each held 1 s; what the measured run can learn
from it is the command shape's peaks (:mod:`roomkeeper.jobs.sizes`).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench_swarm import batch_argv, bench_groups, pressure_figures, run_in_group
from groups import end_on_sigterm
from swarmgen import Job

from roomkeeper.units import parse_size


def turns(seed: int, count: int) -> list[Job]:
    """The agent turns: steady growth to 0.75..0.95 GB over 20..60 s, held 60..180 s."""
    rng = random.Random(seed)
    return [
        Job(
            size=int(rng.uniform(0.75e9, 0.95e9)),
            grow_s=round(rng.uniform(20, 60), 1),
            hold_s=round(rng.uniform(60, 180), 1),
            shape="steady",
            start_delay_s=0.0,
        )
        for _ in range(count)
    ]


def group_peak(group: Path, version: int) -> int:
    """The most the group held while the contender ran."""
    name = "memory.peak" if version == 2 else "memory.max_usage_in_bytes"
    try:
        return int((group / name).read_text())
    except (OSError, ValueError):
        return -1  # a kernel before memory.peak (v2, Linux 5.19)


def learn(
    seed: int, count: int, parent: Path, version: int, limit: int, argv: list[str], tmpdir: Path
) -> None:
    """An earlier session in the same home: ``count`` turns of ``seed``, each held 1 s."""
    done = tmpdir / "learned"
    done.mkdir()
    earlier = [replace(j, hold_s=1.0) for j in turns(seed, count)]
    commands = tmpdir / "earlier.txt"
    commands.write_text(
        "".join(j.command(str(done / str(i))) + "\n" for i, j in enumerate(earlier))
    )
    wall, kills = run_in_group(parent, version, limit, argv, commands, tmpdir / "earlier.err")
    completed = len(list(done.iterdir()))
    print(
        f"  learned from {completed}/{count} turns of seed {seed} "
        f"({min(j.size for j in earlier) / 1e9:.2f}..{max(j.size for j in earlier) / 1e9:.2f} GB) "
        f"in {wall:.1f} s, OOM kills {kills}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", default="pack,strict,6,7")
    parser.add_argument("--jobs", type=int, default=30)
    parser.add_argument("--limit", default="6G")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-running", type=int, help="give roomkeeper this count (none)")
    parser.add_argument("--keep", type=Path, help="keep each roomkeeper run's stderr here")
    parser.add_argument(
        "--learned-from", type=int, metavar="SEED", help="run turns of SEED first, unmeasured"
    )
    parser.add_argument("--learn-turns", type=int, default=5, help="how many (default 5)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, end_on_sigterm)  # a timeout's SIGTERM removes the groups too
    parent, version = bench_groups()
    limit = parse_size(args.limit)
    jobs = turns(args.seed, args.jobs)
    print(
        f"cgroup v{version}, limit {limit / 1e9:.2f} GB, {len(jobs)} turns of "
        f"{min(j.size for j in jobs) / 1e9:.2f}..{max(j.size for j in jobs) / 1e9:.2f} GB, "
        f"growing 20..60 s, held 60..180 s (seed {args.seed})",
        flush=True,
    )
    rk = batch_argv(args.max_running)
    for name in (c.strip() for c in args.contenders.split(",") if c.strip()):
        if name == "pack":
            argv = rk
        elif name == "strict":
            argv = [*rk, "--strict"]
        elif name.isdigit():
            argv = ["parallel", "-j", name]
        else:
            sys.exit(f"unknown contender {name!r}: give pack, strict or a number")
        with tempfile.TemporaryDirectory() as tmp:
            tmpdir = Path(tmp)
            done = tmpdir / "done"
            done.mkdir()
            commands = tmpdir / "turns.txt"
            commands.write_text(
                "".join(j.command(str(done / str(i))) + "\n" for i, j in enumerate(jobs))
            )
            os.environ["ROOMKEEPER_HOME"] = str(tmpdir / "home")  # nothing learned before
            if args.learned_from is not None and "roomkeeper" in argv:
                learn(args.learned_from, args.learn_turns, parent, version, limit, argv, tmpdir)
            err = tmpdir / "err.txt"
            peak: list[int] = []
            wall, kills = run_in_group(
                parent,
                version,
                limit,
                argv,
                commands,
                err,
                measure=lambda group, kept=peak: kept.append(group_peak(group, version)),
            )
            completed = len(list(done.iterdir()))
            label = name if not name.isdigit() else f"parallel -j {name}"
            print(
                f"{label:14s} done {completed:2d}/{len(jobs)}  {completed / wall * 60:5.2f} "
                f"jobs/min  wall {wall:6.1f} s  peak used {peak[0] / 1e9:.2f} GB  "
                f"OOM kills {kills}  lost {len(jobs) - completed}",
                flush=True,
            )
            if "roomkeeper" in argv:
                print(f"  {pressure_figures(err.read_text())}", flush=True)
                if args.keep is not None:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(err, args.keep / f"agent-turns-{name}.err")


if __name__ == "__main__":
    main()
