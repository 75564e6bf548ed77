"""Ray, imported only when the ray backend is chosen: the local path never loads it."""

from __future__ import annotations

import importlib
from types import ModuleType

from roomkeeper.errors import UsageError

INSTALL_HINT = "pip install 'roomkeeper[ray]'"


def load_ray() -> ModuleType:
    """The ``ray`` module.

    Raises:
        UsageError: Ray is not installed here; the message says how to install it.
    """
    try:
        return importlib.import_module("ray")
    except ImportError as err:
        raise UsageError(
            f"ROOMKEEPER_BACKEND=ray needs Ray, which is not installed here ({err}); "
            f"install it with {INSTALL_HINT}, or unset ROOMKEEPER_BACKEND to run jobs locally",
            name="ROOMKEEPER_BACKEND",
            value="ray",
        ) from err
