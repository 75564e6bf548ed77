"""The ``roomkeeper`` command: the click group and the command groups it gathers.

Log lines go to stderr, answers to stdout; a refusal or an unknown reading is
an answer (exit 0), and only a usage error exits non-zero.  The commands live
in :mod:`roomkeeper.cli.local` (no gateway needed), :mod:`roomkeeper.cli.remote`
(requests to a running gateway) and :mod:`roomkeeper.cli.service` (running and
stopping the service); none of them imports this module.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from roomkeeper import __version__
from roomkeeper.errors import RoomkeeperError

HOMES: dict[str, str] = {
    "batch": "local",
    "probe": "local",
    "prune": "local",
    "reap": "local",
    "cancel": "remote",
    "history": "remote",
    "jobs": "remote",
    "output": "remote",
    "repair": "remote",
    "resolve": "remote",
    "restart": "remote",
    "run": "remote",
    "status": "remote",
    "gateway": "service",
    "serve": "service",
    "stop": "service",
    "journal": "journal",
    "hook": "hook",
}
"""Each command's name and the module of :mod:`roomkeeper.cli` that holds it (in its
``COMMANDS``), so that running one imports that module alone."""


class _Commands(click.Group):
    """The group, with roomkeeper's own errors said in one line (exit 1), never a traceback,
    and each command loaded from its module (:data:`HOMES`) when it is first asked for.

    Commands raise :class:`~roomkeeper.errors.RoomkeeperError` with a message that
    says what was wrong and how to fix it; this is the one place it is shown.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*HOMES, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in HOMES:
            module = importlib.import_module(f"roomkeeper.cli.{HOMES[cmd_name]}")
            for command in module.COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RoomkeeperError as err:
            raise click.ClickException(str(err)) from None


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("roomkeeper: %(levelname)s %(message)s"))
    root = logging.getLogger("roomkeeper")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="roomkeeper")
@click.option("-v", "--verbose", is_flag=True, help="Log more detail to stderr.")
def main(verbose: bool) -> None:
    """roomkeeper: admit work only when the container has room for it."""
    _setup_logging(verbose)


if __name__ == "__main__":  # pragma: no cover
    main()
