"""Learned sizes: the key, the table (max of the last five), migration, and batch learning."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from roomkeeper.batch.run import line_kind
from roomkeeper.errors import UsageError
from roomkeeper.guard.packing import MemoryPolicy
from roomkeeper.jobs.sizes import KeptSizes, shape_key, size_key, with_shape_size
from roomkeeper.jobs.spec import JobSpec
from roomkeeper.journal.database import Journal
from tests.batch_cli import batch
from tests.fakes import NO_DISK
from tests.gateways import wait_until

MB = 10**6


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db", synchronous="OFF")
    yield j
    j.close()


def test_the_learned_size_is_the_max_of_the_last_five_peaks(journal: Journal) -> None:
    """Six runs: the first (the largest) is forgotten; the max of the five after it is used."""
    assert journal.learned_size("kind:x") is None
    for peak in (900, 100, 500, 200, 300, 400):
        journal.record_peak("kind:x", peak * MB).result()
    assert journal.learned_size("kind:x") == 500 * MB
    journal.record_peak("kind:y", 7).result()
    assert journal.learned_size("kind:y") == 7
    assert journal.learned_size("kind:x") == 500 * MB  # keys do not mix


def test_a_runs_kept_sizes_say_what_the_journal_says_reading_it_once_a_key(
    journal: Journal,
) -> None:
    """A batch's view: after each peak it records it says the journal's own answer (the first
    and largest peak forgotten once five came after it), reading each key's peaks once."""
    for peak in (900, 100):
        journal.record_peak("kind:x", peak * MB).result()
    reads: list[str] = []

    class Counting:
        def learned_size(self, key: str) -> int | None:
            raise AssertionError("the kept view reads recent peaks, not the statistic")

        def record_peaks(self, peaks: list[tuple[str, int]]) -> object:
            return journal.record_peaks(peaks)

        def recent_peaks(self, key: str) -> list[int]:
            reads.append(key)
            return journal.recent_peaks(key)

    kept = KeptSizes(Counting())
    said = [kept.learned_size("kind:x"), kept.learned_size("kind:new")]
    expected = [journal.learned_size("kind:x"), None]
    for peak in (500, 200, 300, 400, 50):
        kept.record_peak("kind:x", peak * MB)
        kept.write().result()  # type: ignore[attr-defined]
        said.append(kept.learned_size("kind:x"))
        expected.append(journal.learned_size("kind:x"))
    kept.record_peak("kind:new", 7)
    assert said == expected
    assert said[-1] == 500 * MB  # 900 was forgotten
    assert kept.learned_size("kind:new") == 7
    assert reads == ["kind:x", "kind:new"]


def test_a_runs_peaks_are_written_together_once_the_first_is_half_a_second_old(
    journal: Journal, tmp_path: Path
) -> None:
    """A batch of short lines ends hundreds a second: their peaks reach the journal in one
    write, each key's last five, once the oldest waited half a second; a key first read after
    its peaks were recorded still sees them."""
    now = [0.0]
    writes: list[list[tuple[str, int]]] = []

    class Recording:
        def record_peaks(self, peaks: list[tuple[str, int]]) -> object:
            writes.append(list(peaks))
            return journal.record_peaks(peaks)

        def recent_peaks(self, key: str) -> list[int]:
            return journal.recent_peaks(key)

    kept = KeptSizes(Recording(), clock=lambda: now[0])
    assert kept.write_due() is None and kept.write() is None  # nothing to write
    for peak in range(1, 8):
        kept.record_peak("kind:x", peak * MB)
        now[0] += 0.05
    kept.record_peak("shape:y", 3 * MB)
    assert kept.write_due() is None and writes == []  # the first peak is 0.35 s old
    assert kept.learned_size("kind:x") == 7 * MB  # unwritten, yet seen by the run
    now[0] = 0.5
    kept.write_due().result(timeout=10)  # type: ignore[union-attr]
    assert writes == [[("kind:x", p * MB) for p in range(3, 8)] + [("shape:y", 3 * MB)]]
    assert journal.recent_peaks("kind:x") == [p * MB for p in range(7, 2, -1)]
    assert journal.recent_peaks("shape:y") == [3 * MB]
    assert kept.write_due() is None  # all written: nothing is due
    now[0] = 5.0
    kept.record_peak("kind:x", 9 * MB)
    assert kept.write_due() is None  # due half a second after this peak, not the last write
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        rows = conn.execute("SELECT count(*) FROM learned_sizes").fetchone()[0]
    assert rows == 6  # five of kind:x, one of shape:y


def test_a_key_first_read_after_its_unwritten_peaks_puts_them_before_the_journals(
    journal: Journal,
) -> None:
    """A shape read for the first time while two of this run's peaks wait to be written: its
    five are those two and the journal's newest three, not the journal's five."""
    for peak in (100, 200, 300, 400, 500):
        journal.record_peak("shape:z", peak * MB).result(timeout=10)
    kept = KeptSizes(journal)
    kept.record_peak("shape:z", 900 * MB)
    kept.record_peak("shape:z", 800 * MB)
    assert kept.typical_size("shape:z") == 500 * MB  # of 800, 900, 500, 400, 300
    kept.write().result(timeout=10)  # type: ignore[union-attr]
    assert journal.recent_peaks("shape:z") == [p * MB for p in (800, 900, 500, 400, 300)]


@pytest.mark.kernel
def test_a_batch_writes_its_peaks_while_it_runs_not_only_at_its_end(tmp_path: Path) -> None:
    """A line that ended is in the journal about half a second later, while the batch's other
    line still runs: a batch killed then would not have lost it."""
    home = tmp_path / "home"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ROOMKEEPER_")}
    clean.update(ROOMKEEPER_HOME=str(home), **NO_DISK)
    proc = subprocess.Popen(
        [sys.executable, "-m", "roomkeeper", "batch", "--quiet", "--max-running", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=clean,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write("sleep 60\ntrue\n")
        proc.stdin.close()

        def written() -> bool:
            try:
                with sqlite3.connect(f"file:{home / 'journal.db'}?mode=ro", uri=True) as conn:
                    return bool(conn.execute("SELECT count(*) FROM learned_sizes").fetchone()[0])
            except sqlite3.Error:  # not made yet
                return False

        wait_until(written, "the ended line's peak in the journal", timeout=30)
        assert proc.poll() is None  # the sleep still runs: written before the batch's end
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_the_read_takes_the_last_five_even_of_more_rows(journal: Journal, tmp_path: Path) -> None:
    """The statistic itself looks at the newest five rows, whatever the table holds."""
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        for peak in (900, 100, 500, 200, 300, 400):
            conn.execute(
                "INSERT INTO learned_sizes (key, peak_bytes, at) VALUES ('kind:x', ?, 0)", (peak,)
            )
    assert journal.learned_size("kind:x") == 500


def test_each_key_keeps_only_its_last_five_rows(journal: Journal, tmp_path: Path) -> None:
    """The table does not grow with the number of runs."""
    for peak in range(20):
        journal.record_peak("kind:x", peak).result()
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        count = conn.execute("SELECT count(*) FROM learned_sizes").fetchone()[0]
    assert count == 5
    assert journal.learned_size("kind:x") == 19


def test_a_damaged_row_teaches_nothing_and_fails_nothing(journal: Journal, tmp_path: Path) -> None:
    """A peak that is not a whole number of bytes (edited by hand, a bad disk) is left out."""
    for peak in (100, 300, 200):
        journal.record_peak("shape:x", peak * MB).result()
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        conn.execute(
            "UPDATE learned_sizes SET peak_bytes = 'garbage' WHERE peak_bytes = ?", (100 * MB,)
        )
        conn.execute("UPDATE learned_sizes SET peak_bytes = -5 WHERE peak_bytes = ?", (200 * MB,))
    assert journal.recent_peaks("shape:x") == [300 * MB]
    assert journal.learned_size("shape:x") == 300 * MB  # text sorts above numbers in SQLite
    assert KeptSizes(journal).typical_size("shape:x") is None  # one sound run is too few


def test_the_key_is_the_kind_else_a_hash_of_argv_and_cwd() -> None:
    """Same command in the same place: one key; another directory or argv: another; no text."""
    spec = JobSpec(argv=["make", "test-secret-target"], cwd="/src/a")
    key = size_key(spec)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", key)
    assert "secret" not in key
    assert size_key(JobSpec(argv=["make", "test-secret-target"], cwd="/src/a")) == key
    assert size_key(JobSpec(argv=["make", "test-secret-target"], cwd="/src/b")) != key
    assert size_key(JobSpec(argv=["make", "other"], cwd="/src/a")) != key
    assert size_key(JobSpec(argv=["make test-secret-target"], cwd="/src/a", shell=True)) != key
    assert size_key(JobSpec(argv=["anything"], kind="unit-tests")) == "kind:unit-tests"


def test_the_shape_key_leaves_out_the_arguments_but_not_the_place() -> None:
    """Other arguments: one shape; another script, directory or a kind: another, or none."""
    key = shape_key(JobSpec(argv=["python3 grow.py 1 secret-arg"], shell=True, cwd="/src/a"))
    assert key is not None and re.fullmatch(r"shape:[0-9a-f]{64}", key)
    same = shape_key(JobSpec(argv=["python3 grow.py 2 3"], shell=True, cwd="/src/a"))
    assert same == key
    assert shape_key(JobSpec(argv=["python3 other.py 1"], shell=True, cwd="/src/a")) != key
    assert shape_key(JobSpec(argv=["python3 grow.py 1"], shell=True, cwd="/src/b")) != key
    argv = shape_key(JobSpec(argv=["python3", "grow.py", "9"], cwd="/src/a"))
    assert argv is not None and argv != key  # an argv is not shell text
    assert argv == shape_key(JobSpec(argv=["python3", "grow.py", "1", "2"], cwd="/src/a"))
    assert shape_key(JobSpec(argv=["python3 grow.py 1"], shell=True, kind="k")) is None


def test_a_shapes_typical_size_is_the_median_of_its_last_runs_once_two_are_kept(
    journal: Journal,
) -> None:
    """None after one run; then the (upper) median of the last five, here and as read back."""
    sizes = KeptSizes(journal)
    assert sizes.typical_size("shape:x") is None
    sizes.record_peak("shape:x", 900 * MB)
    assert sizes.typical_size("shape:x") is None  # one run says too little
    for peak in (100, 200, 300, 400, 500):  # the first (900) falls out: with it, 400
        sizes.record_peak("shape:x", peak * MB)
    assert sizes.typical_size("shape:x") == 300 * MB
    sizes.write().result(timeout=10)  # type: ignore[attr-defined]
    assert KeptSizes(journal).typical_size("shape:x") == 300 * MB  # as the journal keeps them


def test_a_shapes_size_goes_only_to_a_pack_job_with_no_estimate_of_its_own() -> None:
    """Only a job that may start on trial with a guess for its estimate is sized by it."""
    spec = JobSpec(argv=["true"], memory_policy=MemoryPolicy.PACK)
    assert with_shape_size(spec, 5 * MB).shape_bytes == 5 * MB
    assert with_shape_size(spec, None).shape_bytes is None
    for other in (
        replace(spec, memory_bytes=MB),
        replace(spec, learned_bytes=MB),
        replace(spec, memory_policy=MemoryPolicy.STRICT),
    ):
        assert with_shape_size(other, 5 * MB).shape_bytes is None


def test_an_older_journal_gains_the_new_columns(tmp_path: Path) -> None:
    """A jobs table from before memory policies is migrated in place when the journal opens."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, owner TEXT NOT NULL, state TEXT NOT NULL, "
            "reason TEXT, exit_code INTEGER, spec TEXT NOT NULL, log_path TEXT NOT NULL, "
            "submitted_at REAL NOT NULL, started_at REAL, ended_at REAL, peak_bytes INTEGER, "
            "error TEXT, resumable INTEGER NOT NULL DEFAULT 0, pid INTEGER, pid_started REAL, "
            "resolution TEXT)"
        )
        conn.execute(
            "INSERT INTO jobs (id, owner, state, spec, log_path, submitted_at) "
            "VALUES ('old', 'o', 'exited', '{\"argv\": [\"true\"]}', '/x.log', 1.0)"
        )
    journal = Journal(path, synchronous="OFF")
    try:
        row = journal.job("old")
        assert row is not None
        assert (row.memory_policy, row.estimate_bytes, row.estimate_source) == (
            "strict",
            None,
            None,
        )
    finally:
        journal.close()
    Journal(path, synchronous="OFF").close()  # a second open finds nothing to add


def test_a_batch_line_names_its_kind_in_a_trailing_comment() -> None:
    """``#kind=NAME`` at the end is the line's kind; one in the middle or quoted is not."""
    assert line_kind("make test #kind=unit-tests", 1) == "unit-tests"
    assert line_kind("make test   # kind=build:linux  ", 1) == "build:linux"
    assert line_kind("echo '#kind=x' done", 1) is None
    assert line_kind("make #kind=x && echo done", 1) is None
    assert line_kind("make test", 1) is None
    with pytest.raises(UsageError, match=r"line 3: kind must be 1 to 200 letters.*'a/b'"):
        line_kind("make #kind=a/b", 3)
    with pytest.raises(UsageError, match="line 2: kind must be"):
        line_kind("make #kind=", 2)


def _alloc(mb: int, kind: str | None = None) -> str:
    line = (
        f"{sys.executable} -c \"b = bytearray({mb} * 10**6); b[::4096] = b'x' * len(b[::4096]); "
        'import time; time.sleep(0.5)"'
    )
    return line + (f" #kind={kind}" if kind else "")


def _estimates(stderr: str) -> dict[str, str]:
    """Each summary row's last cell pair: ``{line number: "80.0 MB (learned)"}``."""
    found = {}
    for line in stderr.splitlines():
        m = re.match(
            r"\s*(\d+)\s.*\s(\S+ [kMG]?B \((?:stated|learned|default)(?:; shape [^)]*)?\))$",
            line,
        )
        if m:
            found[m[1]] = m[2]
    return found


def _default_shown(stderr: str) -> str:
    """The default estimate as the summary shows it ("1.1 GB (default)"): ROOMKEEPER_JOB_MEMORY_MB,
    less in a small container (a quarter of its line), so read, not assumed."""
    shown = _estimates(stderr).get("1", "")
    assert re.fullmatch(r"[0-9.]+ [kMG]?B \(default\)", shown), stderr
    return shown


def _peak_mb(stderr: str, line: str) -> float:
    row = next(r for r in stderr.splitlines() if re.match(rf"\s*{line}\s", r))
    m = re.search(r"([0-9.]+) MB \((?:memory\.peak|sampled cgroup|sampled)\)", row)
    assert m is not None, stderr
    return float(m[1])


@pytest.mark.kernel
def test_a_second_batch_learns_from_the_first(tmp_path: Path) -> None:
    """Run 1 has only the default; run 2 asks each line for what it peaked at in run 1."""
    lines = f"{_alloc(80)}\n{_alloc(1, kind='tiny')}\n"
    first = batch(tmp_path, "--quiet", stdin=lines)
    assert first.returncode == 0, first.stderr
    default = _default_shown(first.stderr)
    assert _estimates(first.stderr) == {"1": default, "2": default}
    peak = _peak_mb(first.stderr, "1")
    assert 75 <= peak <= 130, first.stderr
    # The kind travels to another command: a line of that kind learns what "tiny" held.
    second = batch(tmp_path, "--quiet", stdin=f"{_alloc(80)}\ntrue #kind=tiny\n")
    assert second.returncode == 0, second.stderr
    learned = _estimates(second.stderr)
    assert learned["1"] == f"{peak:.1f} MB (learned)", second.stderr
    assert learned["2"].endswith("(learned)") and learned["2"].split()[:2] != default.split()[:2]
    stated = batch(tmp_path, "--quiet", "--job-memory", "300M", stdin=f"{_alloc(1)}\n")
    assert _estimates(stated.stderr) == {"1": "314.6 MB (stated)"}


@pytest.mark.kernel
def test_no_command_text_reaches_the_journal_file(tmp_path: Path) -> None:
    """Batch learning keeps hashes and peaks only: the db bytes never hold the command."""
    marker = "rk-private-marker-7f3a"
    result = batch(tmp_path, "--quiet", stdin=f"echo {marker} > /dev/null\n")
    assert result.returncode == 0, result.stderr
    files = sorted((tmp_path / "home").glob("journal.db*"))
    assert files and any(f.stat().st_size for f in files)
    assert all(marker.encode() not in f.read_bytes() for f in files)
    with sqlite3.connect(tmp_path / "home" / "journal.db") as conn:
        keys = sorted(r[0] for r in conn.execute("SELECT key FROM learned_sizes"))
    assert [k.split(":")[0] for k in keys] == ["sha256", "shape"]  # the line's and its shape's


@pytest.mark.kernel
def test_a_line_nothing_was_learned_of_is_sized_by_its_command_shape(tmp_path: Path) -> None:
    """Two lines of one script with other arguments: the next batch's third, never seen, is
    shown its shape's median peak beside its default; a line of another script is not."""
    script = tmp_path / "alloc.py"
    script.write_text(
        "import sys, time\n"
        "b = bytearray(int(sys.argv[1]) * 10**6); b[::4096] = b'x' * len(b[::4096])\n"
        "time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.3)\n"
    )
    # A run cut short teaches its shape nothing: what it held so far is no peak of its work.
    cut = batch(tmp_path, "--quiet", "--timeout", "3", stdin=f"{sys.executable} {script} 5 60\n")
    assert cut.returncode == 1 and "timed_out" in cut.stderr, cut.stderr
    first = batch(
        tmp_path, "--quiet", stdin=f"{sys.executable} {script} 60\n{sys.executable} {script} 90\n"
    )
    assert first.returncode == 0, first.stderr
    default = _default_shown(first.stderr)
    assert _estimates(first.stderr) == {"1": default, "2": default}
    peaks = sorted(_peak_mb(first.stderr, n) for n in ("1", "2"))
    assert 50 <= peaks[0] < peaks[1] <= 140, first.stderr
    other = tmp_path / "other.py"
    other.write_text("pass\n")
    second = batch(
        tmp_path, "--quiet", stdin=f"{sys.executable} {script} 30\n{sys.executable} {other}\n"
    )
    assert second.returncode == 0, second.stderr
    estimates = _estimates(second.stderr)
    shaped = default.replace("(default)", f"(default; shape {peaks[1]:.1f} MB)")
    assert estimates["1"] == shaped, second.stderr
    assert estimates["2"] == default, second.stderr
    with sqlite3.connect(tmp_path / "home" / "journal.db") as conn:
        kept = conn.execute("SELECT key FROM learned_sizes").fetchall()
    # Five lines, each with its own row; the script's shape has the three that ran to their
    # end, other.py's its one.
    shapes = [k for (k,) in kept if k.startswith("shape:")]
    assert len(kept) - len(shapes) == 5, kept
    assert sorted(shapes.count(k) for k in set(shapes)) == [1, 3], kept


@pytest.mark.kernel
def test_a_bad_kind_fails_the_batch_before_anything_runs(tmp_path: Path) -> None:
    """One line, exit 1, the line's number and how to write it; nothing ran."""
    flag = tmp_path / "ran"
    result = batch(tmp_path, stdin=f"touch {flag}\nmake #kind=no/slash\n")
    assert result.returncode == 1
    assert "line 2: kind must be 1 to 200 letters" in result.stderr
    assert "'make test #kind=unit-tests'" in result.stderr
    assert not flag.exists()
    option = batch(tmp_path, "--kind", "a b", stdin="true\n")
    assert option.returncode == 2 and "kind must be 1 to 200 letters" in option.stderr


@pytest.mark.kernel
def test_a_batch_that_cannot_open_the_journal_still_runs(tmp_path: Path) -> None:
    """ROOMKEEPER_HOME unusable but --logs fine: one line says learning is off, the lines run."""
    (tmp_path / "home").write_text("")  # the helper's ROOMKEEPER_HOME: a file, not a folder
    # The disk rule reads the workspace, by default under the home: give it one that exists.
    result = batch(
        tmp_path,
        "--logs",
        str(tmp_path / "logs"),
        stdin="true\n",
        ROOMKEEPER_WORKSPACE=str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("learned sizes are off") == 1
    assert "1 commands, 0 failed" in result.stderr
