"""Variables, sizes and places: defaults, units, and bad values replaced once, out loud."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from roomkeeper.config import Settings, read_settings
from roomkeeper.errors import SizeError, UsageError
from roomkeeper.paths import home_dir, workspace_dir
from roomkeeper.units import MIB, format_gb, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("600M", 600 * MIB),
        ("1.5G", 1536 * MIB),
        ("512K", 512 * 1024),
        ("1048576", 1048576),
        ("2g", 2 * 1024**3),
        ("600MiB", 600 * MIB),
        (" 1T ", 1024**4),
    ],
)
def test_sizes_use_binary_suffixes_like_gnu_parallel(text: str, expected: int) -> None:
    """600M is 600 MiB, 1.5G is 1.5 GiB, a plain number is bytes."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1M", "12X", "M", "1.2.3G", "nan"])
def test_bad_sizes_say_what_a_size_looks_like(text: str) -> None:
    """A size that cannot be read names the expected form and the value given."""
    with pytest.raises(SizeError, match=r"must be a size such as 600M, 1\.5G"):
        parse_size(text, name="--job-memory")


def test_durations() -> None:
    """Durations take s, m, h, d suffixes; zero or garbage is a usage error."""
    assert parse_duration("90") == 90
    assert parse_duration("1.5h") == 5400
    with pytest.raises(UsageError, match="positive duration"):
        parse_duration("0s")


def test_figures_print_in_decimal_gb() -> None:
    """Summaries print decimal GB, as container vendors do."""
    assert format_gb(24_000_000_000) == "24.00 GB"


def test_defaults_are_the_documented_ones() -> None:
    """With no variables set, the defaults are the README's."""
    s = read_settings({})
    assert s == Settings()
    assert (s.job_memory_bytes, s.job_disk_bytes) == (1024 * MIB, 2048 * MIB)
    assert (s.memory_headroom_percent, s.disk_headroom_percent) == (10, 10)
    assert s.job_warmup_seconds == 600 and s.guard_on and s.memory_limit_bytes is None


def test_mb_variables_are_mib() -> None:
    """Every _MB variable is in MiB."""
    s = read_settings({"ROOMKEEPER_JOB_MEMORY_MB": "600", "ROOMKEEPER_MEMORY_LIMIT_MB": "1.5"})
    assert s.job_memory_bytes == 600 * MIB
    assert s.memory_limit_bytes == int(1.5 * MIB)


def test_unusable_value_is_replaced_by_its_default_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bad value falls back to the default with one warning per distinct value."""
    with caplog.at_level(logging.WARNING, logger="roomkeeper"):
        for _ in range(3):
            s = read_settings({"ROOMKEEPER_MEMORY_HEADROOM_PERCENT": "150"})
        read_settings({"ROOMKEEPER_MEMORY_HEADROOM_PERCENT": "-3"})
        read_settings({"ROOMKEEPER_GUARD": "maybe"})
    assert s.memory_headroom_percent == 10
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "'150'" in m]) == 1
    assert any("'-3'" in m for m in messages)
    assert any("ROOMKEEPER_GUARD='maybe' is not usable: on or off" in m for m in messages)


def test_guard_switch_words() -> None:
    """off/0/false/no turn the guard off; on/1/true/yes keep it on."""
    for word in ("off", "0", "FALSE", "no"):
        assert not read_settings({"ROOMKEEPER_GUARD": word}).guard_on
    for word in ("on", "1", "True", "yes"):
        assert read_settings({"ROOMKEEPER_GUARD": word}).guard_on


def test_home_follows_xdg_then_home_and_is_created_private(tmp_path: Path) -> None:
    """ROOMKEEPER_HOME defaults to $XDG_STATE_HOME/roomkeeper, else ~/.local/state/roomkeeper."""
    xdg = home_dir({"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert xdg == tmp_path / "xdg" / "roomkeeper" and xdg.is_dir()
    assert stat.S_IMODE(xdg.stat().st_mode) == 0o700
    plain = home_dir({"HOME": str(tmp_path / "h")})
    assert plain == tmp_path / "h" / ".local/state/roomkeeper" and plain.is_dir()
    explicit = home_dir({"ROOMKEEPER_HOME": str(tmp_path / "rk")}, create=False)
    assert explicit == tmp_path / "rk" and not explicit.exists()


def test_workspace_defaults_to_a_folder_in_home(tmp_path: Path) -> None:
    """ROOMKEEPER_WORKSPACE defaults to ROOMKEEPER_HOME/workspace and is not created by asking."""
    assert workspace_dir({"ROOMKEEPER_HOME": str(tmp_path / "rk")}) == tmp_path / "rk/workspace"
    assert workspace_dir({"ROOMKEEPER_WORKSPACE": str(tmp_path / "w")}) == tmp_path / "w"
    assert not (tmp_path / "rk").exists()


def test_a_variable_changed_in_the_environment_is_read_on_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Settings are kept by their raw values, never past a change: os.environ (read the fast
    way) and a plain mapping both say a new value at once, and its removal."""
    monkeypatch.delenv("ROOMKEEPER_JOB_MEMORY_MB", raising=False)
    default = read_settings().job_memory_bytes
    monkeypatch.setenv("ROOMKEEPER_JOB_MEMORY_MB", "123")
    assert read_settings().job_memory_bytes == 123 * MIB
    monkeypatch.setenv("ROOMKEEPER_JOB_MEMORY_MB", "124")
    assert read_settings().job_memory_bytes == 124 * MIB
    monkeypatch.delenv("ROOMKEEPER_JOB_MEMORY_MB")
    assert read_settings().job_memory_bytes == default
    env = {"ROOMKEEPER_JOB_MEMORY_MB": "7", "ROOMKEEPER_WORKSPACE": "/w\udcff"}
    assert read_settings(env).job_memory_bytes == 7 * MIB
    env["ROOMKEEPER_JOB_MEMORY_MB"] = "8"
    assert (read_settings(env).job_memory_bytes, read_settings(env).workspace) == (
        8 * MIB,
        "/w\udcff",
    )
    monkeypatch.setenv("ROOMKEEPER_WORKSPACE", "/w\udcff")  # not UTF-8: as os.environ shows it
    assert read_settings().workspace == "/w\udcff"
