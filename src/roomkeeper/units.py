"""Sizes and durations as people type them, and figures as we print them.

Sizes use binary suffixes, as GNU parallel does: ``512K`` is 512 x 1024
bytes, ``600M`` is 600 x 1024**2, ``1.5G`` is 1.5 x 1024**3; a plain number
is bytes.  Every ``_MB`` variable is in MiB.  Printed figures are decimal GB
(10**9 bytes), the unit container vendors use.
"""

from __future__ import annotations

import math
import re

from roomkeeper.errors import SizeError, UsageError

MIB = 1024 * 1024
GB = 1_000_000_000

_SIZE_SUFFIXES = {"": 1, "B": 1, "K": 1024, "M": MIB, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_size(text: str, *, name: str = "size") -> int:
    """Read a size a person typed (``600M``, ``1.5G``, ``512K``, ``1048576``) as bytes.

    Args:
        text: the size; suffixes K, M, G, T are binary (x 1024), case does not
            matter, and a trailing ``B`` or ``iB`` is allowed.
        name: what the size is for, named in the error message.

    Raises:
        SizeError: the text is not a non-negative size.
    """
    match = _SIZE_RE.match(text)
    if match is None:
        raise SizeError(
            f"{name} must be a size such as 600M, 1.5G, 512K or a number of bytes (got {text!r})",
            name=name,
            value=text,
        )
    number, suffix = match.groups()
    return int(float(number) * _SIZE_SUFFIXES[suffix.upper()])


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Read a duration a person typed (``90``, ``90s``, ``5m``, ``1.5h``, ``2d``) as seconds.

    Raises:
        UsageError: the text is not a positive duration.
    """
    match = _DURATION_RE.match(text)
    seconds = 0.0
    if match is not None:
        number, unit = match.groups()
        seconds = float(number) * _DURATION_UNITS[unit.lower()]
    if match is None or not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(
            f"{name} must be a positive duration such as 90s, 5m or 1.5h (got {text!r})",
            name=name,
            value=text,
        )
    return seconds


def format_gb(n_bytes: int | float) -> str:
    """Format bytes as decimal GB with two decimals, the way every summary prints them."""
    return f"{n_bytes / GB:.2f} GB"


def format_bytes(n_bytes: int | float) -> str:
    """Format bytes for a person, in decimal units (kB, MB, GB, TB)."""
    value = float(n_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
