"""Pure parsers: real captured text in, records out; arbitrary bytes never escape as a crash."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roomkeeper.errors import KernelFileError
from roomkeeper.kernel import parsers
from tests.kernel_files import FIXTURES

V2 = FIXTURES / "cgroup-v2-host"
V1 = FIXTURES / "cgroup-v1-host"


def test_v2_memory_files_parse_to_the_captured_numbers() -> None:
    """memory.current, memory.max and memory.stat of the v2 capture read back exactly."""
    group = V2 / "sys/fs/cgroup/rkfix_413"
    assert parsers.parse_single_value((group / "memory.current").read_bytes(), "c") == 543940608
    assert parsers.parse_v2_limit((group / "memory.max").read_bytes()) == 1073741824
    stat = parsers.parse_flat_keyed((group / "memory.stat").read_bytes(), "memory.stat")
    assert stat["active_file"] == 303104
    assert stat["inactive_file"] == 315510784
    assert stat["slab_reclaimable"] == 8736752


def test_v2_max_means_no_limit() -> None:
    """cgroup v2 writes "max" for no limit."""
    assert parsers.parse_v2_limit(b"max\n") is None


def test_v1_huge_value_means_no_limit() -> None:
    """cgroup v1's LONG_MAX-rounded "unlimited" is no limit; a real limit is kept."""
    root = V1 / "sys/fs/cgroup/memory"
    assert parsers.parse_v1_limit((root / "memory.limit_in_bytes").read_bytes()) is None
    assert parsers.parse_v1_limit((root / "rkfix_v1/memory.limit_in_bytes").read_bytes()) == 2**30
    # 64 KiB pages round LONG_MAX down further; still unlimited.
    assert parsers.parse_v1_limit(b"9223372036854710272\n") is None


def test_selected_keys_only_are_read_and_checked() -> None:
    """With keys given, memory.stat lines that are not asked for are not parsed."""
    raw = b"total_active_file 5\ngarbage line here\ntotal_inactive_file 7\nactive_file 1\n"
    keys = frozenset({"total_active_file", "total_inactive_file"})
    assert parsers.parse_flat_keyed(raw, "memory.stat", keys) == {
        "total_active_file": 5,
        "total_inactive_file": 7,
    }
    with pytest.raises(KernelFileError, match="expected 'key value'"):
        parsers.parse_flat_keyed(raw, "memory.stat")


def test_meminfo_is_read_in_bytes() -> None:
    """meminfo's kB are KiB; fields without a unit stay counts."""
    info = parsers.parse_meminfo((V1 / "proc/meminfo").read_bytes())
    assert info["MemTotal"] == 24684092 * 1024
    assert info["MemAvailable"] == 24133500 * 1024
    assert info["HugePages_Total"] == 0


def test_pressure_lines_parse() -> None:
    """A PSI file has some and full lines with three averages and a total."""
    p = parsers.parse_pressure((V1 / "proc/pressure/memory").read_bytes())
    assert p.some == parsers.PressureLine(0.0, 0.05, 0.18, 1261752)
    assert p.full == parsers.PressureLine(0.0, 0.02, 0.07, 644020)


def test_old_cpu_pressure_without_full_line() -> None:
    """/proc/pressure/cpu before Linux 5.13 has no full line: full is None, not zero."""
    p = parsers.parse_pressure(b"some avg10=1.50 avg60=0.20 avg300=0.00 total=42\n")
    assert p.full is None
    assert p.some.avg10 == 1.5


def test_proc_self_cgroup_finds_v2_and_v1_memory() -> None:
    """The v2 line and the v1 memory controller's line are both found."""
    assert parsers.parse_proc_self_cgroup((V1 / "proc/self/cgroup").read_bytes()) == (
        "/",
        "/rkfix_v1",
    )
    assert parsers.parse_proc_self_cgroup((V2 / "proc/self/cgroup").read_bytes()) == (
        "/rkfix_413",
        None,
    )


def test_v1_controller_path_is_read_from_its_own_line() -> None:
    """The freezer's path comes from its v1 line; a pure v2 host has none."""
    v1 = (V1 / "proc/self/cgroup").read_bytes()
    assert parsers.parse_v1_controller_path(v1, "freezer") == "/"
    assert parsers.parse_v1_controller_path(v1, "memory") == "/rkfix_v1"
    assert parsers.parse_v1_controller_path(b"3:cpu,cpuacct:/a\n", "cpuacct") == "/a"
    v2 = (V2 / "proc/self/cgroup").read_bytes()
    assert parsers.parse_v1_controller_path(v2, "freezer") is None


def test_pid_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    """comm may hold ") (": the state and parent follow the last ")"."""
    raw = b"4242 (tmux: (server) 1) T 17 4242 4242 0 -1 4194560 0 0\n"
    assert parsers.parse_pid_stat(raw) == parsers.ProcessStat("tmux: (server) 1", "T", 17)
    with pytest.raises(KernelFileError, match="unexpected text"):
        parsers.parse_pid_stat(b"4242 sleep S 1\n")


def test_mountinfo_keeps_cgroup_mounts_and_unescapes() -> None:
    """Only cgroup mounts are kept; an escaped space in a mount point is decoded."""
    mounts = parsers.parse_mountinfo((V1 / "proc/self/mountinfo").read_bytes())
    memory = [m for m in mounts if "memory" in m.super_options]
    assert [m.mount_point for m in memory] == ["/sys/fs/cgroup/memory"]
    assert {m.fs_type for m in mounts} == {"cgroup", "cgroup2"}
    line = b"40 31 0:37 / /sys/fs/cgroup/my\\040group rw - cgroup2 cgroup2 rw\n"
    assert parsers.parse_mountinfo(line)[0].mount_point == "/sys/fs/cgroup/my group"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"", "expected one number"),
        (b"-5\n", "non-negative integer"),
        (b"12 34\n", "expected one number"),
        (b"\xff\xfe", "not ASCII"),
        (b"1e9\n", "non-negative integer"),
        (b"99999999999999999999999\n", "out of range"),
    ],
)
def test_single_value_rejects_garbage_with_a_reason(raw: bytes, match: str) -> None:
    """Empty, negative, multi-field, binary and oversized counters are errors that say why."""
    with pytest.raises(KernelFileError, match=match):
        parsers.parse_single_value(raw, "memory.current")


PARSERS = [
    lambda raw: parsers.parse_single_value(raw, "x"),
    parsers.parse_v2_limit,
    parsers.parse_v1_limit,
    lambda raw: parsers.parse_flat_keyed(raw, "memory.stat"),
    lambda raw: parsers.parse_flat_keyed(raw, "memory.stat", frozenset({"active_file"})),
    parsers.parse_meminfo,
    lambda raw: parsers.parse_meminfo(raw, frozenset({"MemTotal"})),
    parsers.parse_pressure,
    parsers.parse_proc_self_cgroup,
    lambda raw: parsers.parse_v1_controller_path(raw, "freezer"),
    parsers.parse_pid_stat,
    parsers.parse_mountinfo,
]


@pytest.mark.parametrize("parse", PARSERS)
@settings(max_examples=150, deadline=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_every_parser_answers_or_raises_its_own_error(parse, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    """Arbitrary bytes give a value or KernelFileError, never any other exception."""
    with contextlib.suppress(KernelFileError):
        parse(raw)
