"""Option parsing shared by the command groups."""

from __future__ import annotations

import click

from roomkeeper.errors import SizeError, UsageError
from roomkeeper.jobs.spec import validate_kind
from roomkeeper.units import parse_size


def parse_size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Click callback: a size such as ``600M``, ``1.5G``, ``512K`` or plain bytes."""
    if value is None:
        return None
    try:
        return parse_size(value, name=param.name or "size")
    except SizeError as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from err


def parse_kind_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: a job kind, the name its learned size is kept under."""
    if value is None:
        return None
    try:
        return validate_kind(value)
    except UsageError as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from err
