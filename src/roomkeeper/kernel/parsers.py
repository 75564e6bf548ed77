"""Pure parsers: kernel file bytes in, a record out.

Each function takes the raw bytes of one kernel file and returns a value or
raises :class:`~roomkeeper.errors.KernelFileError`; none of them touches
the filesystem, so each is tested on real captured text
(``tests/kernel_fixtures``) and on arbitrary bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from roomkeeper.errors import KernelFileError

# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages, which is LONG_MAX
# rounded down to the page size (9223372036854771712 with 4 KiB pages, less
# with 64 KiB pages).  Anything at or above 2**62 bytes is that sentinel.
V1_UNLIMITED_THRESHOLD = 2**62
_MAX_REASONABLE = 2**64  # a counter beyond u64 is garbage, not a reading


@dataclass(frozen=True, slots=True)
class PressureLine:
    """One line of a PSI file: share of wall time stalled, in percent, and total stall in us."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


@dataclass(frozen=True, slots=True)
class Pressure:
    """A PSI file (``/proc/pressure/memory``, ``memory.pressure``...).

    ``full`` is None where the file has no such line: ``/proc/pressure/cpu``
    gained its ``full`` line only in Linux 5.13.
    """

    some: PressureLine
    full: PressureLine | None


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of ``/proc/self/mountinfo`` that matters to us."""

    root: str
    mount_point: str
    fs_type: str
    super_options: frozenset[str]


def _text(raw: bytes, what: str) -> str:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as err:
        raise KernelFileError(what, "not ASCII text") from err
    if "\x00" in text:
        raise KernelFileError(what, "contains NUL bytes")
    return text


def _count(token: str, what: str) -> int:
    """A non-negative decimal integer, as the kernel prints counters."""
    if not token.isascii() or not token.isdigit():
        raise KernelFileError(what, f"expected a non-negative integer, got {token[:40]!r}")
    value = int(token)
    if value >= _MAX_REASONABLE:
        raise KernelFileError(what, f"value {token[:40]} is out of range")
    return value


def parse_single_value(raw: bytes, what: str) -> int:
    """A file holding one counter (``memory.current``, ``memory.usage_in_bytes``)."""
    tokens = _text(raw, what).split()
    if len(tokens) != 1:
        raise KernelFileError(what, f"expected one number, got {len(tokens)} fields")
    return _count(tokens[0], what)


def parse_v2_limit(raw: bytes, what: str = "memory.max") -> int | None:
    """cgroup v2 ``memory.max``: bytes, or None for ``max`` (no limit at this level)."""
    tokens = _text(raw, what).split()
    if tokens == ["max"]:
        return None
    if len(tokens) != 1:
        raise KernelFileError(what, f"expected 'max' or one number, got {len(tokens)} fields")
    return _count(tokens[0], what)


def parse_v1_limit(raw: bytes, what: str = "memory.limit_in_bytes") -> int | None:
    """cgroup v1 ``memory.limit_in_bytes``: bytes, or None for the huge "unlimited" value."""
    value = parse_single_value(raw, what)
    return None if value >= V1_UNLIMITED_THRESHOLD else value


def _keyed_lines(text: str, keys: frozenset[str] | None, separator: str) -> list[str]:
    """The lines of ``text`` that start with one of ``keys`` (all lines when None).

    The guard reads memory.stat and meminfo on every decision and needs two
    or three of their fifty to a hundred lines: finding those lines with
    ``str.find`` keeps a decision inside its time budget.
    """
    if keys is None:
        return text.splitlines()
    text = "\n" + text
    lines = []
    for key in keys:
        start = text.find(f"\n{key}{separator}")
        if start >= 0:
            end = text.find("\n", start + 1)
            lines.append(text[start + 1 : end if end >= 0 else len(text)])
    return lines


def parse_flat_keyed(raw: bytes, what: str, keys: frozenset[str] | None = None) -> dict[str, int]:
    """``key value`` lines (``memory.stat``) as a dict of non-negative integers.

    Args:
        raw: the file's bytes.
        what: the file's kernel name, for error messages.
        keys: read (and check) only these keys; every line when None.
    """
    result: dict[str, int] = {}
    for line in _keyed_lines(_text(raw, what), keys, " "):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise KernelFileError(what, f"expected 'key value', got {line[:60]!r}")
        result[fields[0]] = _count(fields[1], what)
    return result


def stat_fields(stat: dict[str, int], keys: tuple[str, ...], what: str) -> list[int]:
    """Pick required keys from a parsed ``memory.stat``, saying which one is missing."""
    try:
        return [stat[key] for key in keys]
    except KeyError as err:
        raise KernelFileError(what, f"has no {err.args[0]} line") from err


def parse_meminfo(raw: bytes, keys: frozenset[str] | None = None) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per field (the file says kB, meaning KiB).

    Args:
        raw: the file's bytes.
        keys: read (and check) only these fields; every line when None.
    """
    what = "meminfo"
    result: dict[str, int] = {}
    for line in _keyed_lines(_text(raw, what), keys, ":"):
        if not line.strip():
            continue
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not 1 <= len(fields) <= 2 or (len(fields) == 2 and fields[1] != "kB"):
            raise KernelFileError(what, f"unexpected line {line[:60]!r}")
        value = _count(fields[0], what)
        result[key.strip()] = value * 1024 if len(fields) == 2 else value
    return result


def _psi_line(fields: list[str], what: str) -> PressureLine:
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep:
            raise KernelFileError(what, f"expected key=value, got {field[:40]!r}")
        values[key] = value
    try:
        averages = [float(values[k]) for k in ("avg10", "avg60", "avg300")]
        total = _count(values["total"], what)
    except (KeyError, ValueError) as err:
        raise KernelFileError(what, "a PSI line lacks avg10/avg60/avg300/total") from err
    if not all(0.0 <= a <= 100.0 for a in averages):  # also rejects nan
        raise KernelFileError(what, "a PSI average lies outside 0..100")
    return PressureLine(averages[0], averages[1], averages[2], total)


def parse_pressure(raw: bytes, what: str = "pressure") -> Pressure:
    """A PSI file: a ``some`` line and, except for old ``cpu`` files, a ``full`` line."""
    lines: dict[str, PressureLine] = {}
    for line in _text(raw, what).splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] not in ("some", "full") or fields[0] in lines:
            raise KernelFileError(what, f"unexpected line {line[:60]!r}")
        lines[fields[0]] = _psi_line(fields[1:], what)
    if "some" not in lines:
        raise KernelFileError(what, "has no 'some' line")
    return Pressure(some=lines["some"], full=lines.get("full"))


def parse_proc_self_cgroup(raw: bytes) -> tuple[str | None, str | None]:
    """``/proc/self/cgroup``: (the v2 path, the v1 memory controller's path), each maybe None."""
    what = "cgroup membership"
    v2_path: str | None = None
    v1_memory_path: str | None = None
    for line in _text(raw, what).splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] != "0" and "memory" not in parts[1]:
            if not parts[2].startswith("/"):
                raise KernelFileError(what, f"unexpected line {line[:60]!r}")
            continue  # another v1 controller
        if len(parts) != 3 or not parts[2].startswith("/"):
            raise KernelFileError(what, f"unexpected line {line[:60]!r}")
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_memory_path = path
    return v2_path, v1_memory_path


def parse_v1_controller_path(raw: bytes, controller: str) -> str | None:
    """``/proc/self/cgroup``: the path of the v1 hierarchy that holds ``controller`` (``freezer``).

    None where no v1 hierarchy holds it (a pure v2 host has only the ``0::`` line).
    """
    what = "cgroup membership"
    for line in _text(raw, what).splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0] != "0" and controller in parts[1].split(","):
            if not parts[2].startswith("/"):
                raise KernelFileError(what, f"unexpected line {line[:60]!r}")
            return parts[2]
    return None


@dataclass(frozen=True, slots=True)
class ProcessStat:
    """The fields of ``/proc/<pid>/stat`` that say what a process is and where it hangs."""

    comm: str  # the command name, at most 15 characters
    state: str  # "R", "S", "D", "T" (stopped), "t" (traced), "Z" (zombie)...
    ppid: int


def parse_pid_stat(raw: bytes) -> ProcessStat:
    """``/proc/<pid>/stat``: its name, state and parent."""
    what = "stat"
    text = _text(raw, what)
    # comm (field 2) may hold spaces and parentheses: it ends at the last ")".
    head, sep, rest = text.rpartition(")")
    fields = rest.split()
    if not sep or "(" not in head or len(fields) < 2:
        raise KernelFileError(what, f"unexpected text {text[:60]!r}")
    return ProcessStat(head.partition("(")[2], fields[0], _count(fields[1], what))


def _unescape_mount_field(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \040 \011 \012 \134.
    if "\\" not in field:
        return field
    out: list[str] = []
    i = 0
    while i < len(field):
        digits = field[i + 1 : i + 4]
        if field[i] == "\\" and len(digits) == 3 and all(c in "01234567" for c in digits):
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(raw: bytes) -> list[Mount]:
    """The cgroup mounts of ``/proc/self/mountinfo`` (fs type cgroup or cgroup2)."""
    what = "mountinfo"
    mounts: list[Mount] = []
    for line in _text(raw, what).splitlines():
        if not line.strip():
            continue
        fields = line.split()
        try:
            dash = fields.index("-", 6)
            fs_type, super_options = fields[dash + 1], fields[dash + 3]
        except (ValueError, IndexError) as err:
            raise KernelFileError(what, f"unexpected line {line[:60]!r}") from err
        if fs_type not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                root=_unescape_mount_field(fields[3]),
                mount_point=_unescape_mount_field(fields[4]),
                fs_type=fs_type,
                super_options=frozenset(super_options.split(",")),
            )
        )
    return mounts
