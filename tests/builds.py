"""Real builds for the jobserver tests: a Makefile, a build.ninja and a cargo workspace
whose steps grow to a known size, and the trace their steps leave."""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

STEP = Path(__file__).resolve().parent / "build_step.py"
# Each step grows over GROW_S and holds for HOLD_S: slow enough that the meter (a round every
# 0.1 s) sees every step grow, short enough that a build of 8 steps takes a few seconds.
GROW_S = 0.8
HOLD_S = 0.2


def step_command(trace: Path, name: str, size: int, grow_s: float, hold_s: float) -> str:
    """The shell command of one step."""
    return f"{sys.executable} {STEP} {trace} {name} {size} {grow_s} {hold_s}"


def makefile(
    folder: Path,
    trace: Path,
    steps: int,
    size: int,
    *,
    prefix: str = "s",
    hold_s: float = HOLD_S,
) -> Path:
    """A Makefile of ``steps`` independent steps under ``all``, each growing to ``size`` and
    holding it ``hold_s``."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{prefix}{i}" for i in range(1, steps + 1)]
    rules = "".join(f"{n}:\n\t@{step_command(trace, n, size, GROW_S, hold_s)}\n" for n in names)
    (folder / "Makefile").write_text(
        f".PHONY: all {' '.join(names)}\nall: {' '.join(names)}\n{rules}"
    )
    return folder


def ninja_file(folder: Path, trace: Path, steps: int, size: int) -> Path:
    """A build.ninja of ``steps`` independent steps, each growing to ``size``."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["rule step\n  command = $cmd\n"]
    for i in range(1, steps + 1):
        lines.append(
            f"build out{i}: step\n  cmd = {step_command(trace, f'n{i}', size, GROW_S, HOLD_S)}"
            f" && touch out{i}\n"
        )
    (folder / "build.ninja").write_text("\n".join(lines))
    return folder


def cargo_workspace(folder: Path, trace: Path, crates: int, size: int) -> Path:
    """A workspace of ``crates`` crates with no dependencies, no registry needed: each one's
    build script notes its start, grows to ``size``, holds, and notes its end."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"c{i}" for i in range(1, crates + 1)]
    members = ", ".join(f'"{n}"' for n in names)
    (folder / "Cargo.toml").write_text(f'[workspace]\nmembers = [{members}]\nresolver = "2"\n')
    for name in names:
        crate = folder / name
        (crate / "src").mkdir(parents=True, exist_ok=True)
        (crate / "Cargo.toml").write_text(
            f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n'
        )
        (crate / "src" / "lib.rs").write_text("pub fn f() -> u32 { 1 }\n")
        (crate / "build.rs").write_text(
            _BUILD_RS.replace("NAME", name).replace("TRACE", str(trace)).replace("SIZE", str(size))
        )
    return folder


_BUILD_RS = """
use std::io::Write;
fn note(what: &str) {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    // One write per line: writeln! on a File writes each formatted piece apart, and the
    // pieces of build scripts running at once would interleave in the shared trace.
    let line = format!("{} NAME {:.3}\n", what, t.as_secs_f64());
    let mut f = std::fs::OpenOptions::new().append(true).create(true).open("TRACE").unwrap();
    f.write_all(line.as_bytes()).unwrap();
}
fn main() {
    note("start");
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..10 {
        held.push(vec![1u8; SIZE / 10]);
        std::thread::sleep(std::time::Duration::from_millis(80));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    note("end");
    println!("cargo:rerun-if-changed=build.rs");
    drop(held);
}
"""


@dataclass(frozen=True, slots=True)
class Trace:
    """What the steps noted: each step's start and end, any holder's pids, and the steps that
    ended of SIGTERM."""

    starts: dict[str, float]
    ends: dict[str, float]
    holders: list[list[int]]
    terms: dict[str, float]

    def most_at_once(self, prefix: str = "") -> int:
        """The most steps (named with ``prefix``) that ran at the same moment."""
        events = sorted(
            [(t, 1) for n, t in self.starts.items() if n.startswith(prefix)]
            + [(t, -1) for n, t in self.ends.items() if n.startswith(prefix)]
        )
        most = now = 0
        for _, change in events:
            now += change
            most = max(most, now)
        return most


def read_trace(path: Path) -> Trace:
    """The trace file's lines, parsed."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}
    holders: list[list[int]] = []
    terms: dict[str, float] = {}
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        words = line.split()
        if words[0] == "start":
            starts[words[1]] = float(words[2])
        elif words[0] == "end":
            ends[words[1]] = float(words[2])
        elif words[0] == "holder":
            holders.append([int(w) for w in words[1:-1]])
        elif words[0] == "term":
            terms[words[1]] = float(words[2])
    return Trace(starts, ends, holders, terms)


def wheel_ninja() -> str:
    """The ninja of the PyPI wheel beside this Python (1.13 or later: a FIFO client)."""
    found = shutil.which("ninja", path=str(Path(sys.executable).parent))
    assert found is not None, (
        "no ninja beside this Python: install the test extra (pip install -e '.[test]'), "
        "which brings ninja>=1.13 from PyPI"
    )
    return found


@dataclass
class StepSamples:
    """What the sampler saw of a build's steps: the most memory of their own they held
    together (resident less shared), and the most of them running (not stopped by the
    jobserver) at one look."""

    most_bytes: int = 0
    most_running: int = 0


def _is_step(process: psutil.Process, marker: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(marker in part for part in [process.exe(), *process.cmdline()])
    return False


@contextlib.contextmanager
def sampling_steps(marker: str, every_s: float = 0.02) -> Iterator[StepSamples]:
    """Look at the build's steps (processes whose executable or command line holds
    ``marker``: the trace's path, or a cargo target folder) every ``every_s`` while the
    block runs: their own resident memory together, and how many are not stopped."""
    samples = StepSamples()
    done = threading.Event()

    def look() -> None:
        while not done.wait(every_s):
            held = running = 0
            steps = [p for p in psutil.process_iter() if _is_step(p, marker)]
            # A shell a tool runs a step through matches too: a step is counted once, by the
            # process at its bottom (no matching process below it).
            parents = set()
            for process in steps:
                with contextlib.suppress(psutil.Error):
                    parents.add(process.ppid())
            for process in steps:
                with contextlib.suppress(psutil.Error):
                    memory = process.memory_info()
                    held += memory.rss - memory.shared  # its own: libraries counted once
                    if process.pid not in parents:
                        running += process.status() != psutil.STATUS_STOPPED
            samples.most_bytes = max(samples.most_bytes, held)
            samples.most_running = max(samples.most_running, running)

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        yield samples
    finally:
        done.set()
        watcher.join()
