"""The package's layering, as its docstring states it, holds in the code."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import roomkeeper

PACKAGE = Path(roomkeeper.__file__).parent
UNLAYERED = {"__init__", "__main__", "testing"}  # the package itself, its entry, the fakes


def layers() -> dict[str, int]:
    """Module -> layer number, read from the numbered list in the package docstring."""
    assert roomkeeper.__doc__ is not None
    found: dict[str, int] = {}
    layer = 0
    for line in roomkeeper.__doc__.splitlines():
        numbered = re.match(r"(\d+)\. ", line)
        if numbered:
            layer = int(numbered.group(1))
        elif not line.startswith("   "):
            layer = 0  # the list has ended
        if layer:
            for name in re.findall(r"``(\w+)``", line):
                if name != "roomkeeper":  # the command's name, not a module
                    found[name] = layer
    return found


def modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in UNLAYERED)


def imported(module: str) -> set[str]:
    """The roomkeeper modules ``module`` imports anywhere in its text (lazy imports too)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "roomkeeper":
                names.update(a.name for a in node.names)
            elif node.module.startswith("roomkeeper."):
                names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(
                a.name.split(".")[1] for a in node.names if a.name.startswith("roomkeeper.")
            )
    return names - {module}


def test_every_module_has_a_layer() -> None:
    """A new module must be placed in the docstring's list, and the list names no ghost."""
    named = layers()
    assert sorted(named) == modules()


@pytest.mark.parametrize("module", modules())
def test_imports_point_down(module: str) -> None:
    """A module imports only from its own layer or the layers below it."""
    named = layers()
    upward = {m: named[m] for m in imported(module) if named.get(m, 0) > named[module]}
    assert upward == {}, f"{module} (layer {named[module]}) imports from above: {upward}"


@pytest.mark.parametrize("layer", sorted(set(layers().values())))
def test_each_layer_imports_alone(layer: int) -> None:
    """Importing a layer's modules in a fresh interpreter loads nothing from a higher layer."""
    named = layers()
    wanted = [m for m, n in named.items() if n == layer]
    probe = (
        "import importlib, json, sys\n"
        f"for m in {wanted!r}: importlib.import_module('roomkeeper.' + m)\n"
        "print(json.dumps(sorted(k.split('.')[1] for k in sys.modules"
        " if k.startswith('roomkeeper.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = json.loads(done.stdout)
    higher = sorted(m for m in loaded if named.get(m, 0) > layer)
    assert higher == [], f"layer {layer} pulls in {higher}"
