"""The package map, as the package docstring states it, holds in the code.

Two rules around the package hold here too: no test module imports another, and
the benchmarks stand alone (the package, the standard library, third-party code
and their own helpers in ``benchmarks/``; never ``tests``).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import roomkeeper

PACKAGE = Path(roomkeeper.__file__).parent
BASICS = {"errors", "units", "config", "paths"}
TOP_LEVEL = {*BASICS, "__init__", "__main__", "ipc", "testing"}
UNLAYERED = {"__init__", "testing"}  # the public face (lazy names) and the fakes
WEB_FRAMEWORKS = ("fastapi", "starlette")


def allowed_imports() -> dict[str, set[str]]:
    """Subpackage -> what it may import beside the basics, read from the package docstring."""
    assert roomkeeper.__doc__ is not None
    entries = re.findall(
        r"^- ``(\w+)``:(.*?)(?=^- ``|^\s*$)", roomkeeper.__doc__, flags=re.M | re.S
    )
    found: dict[str, set[str]] = {}
    for name, text in entries:
        may = text.split("May import:")
        assert len(may) == 2, f"the entry for {name} must say 'May import:'"
        found[name] = set(re.findall(r"``(\w+)``", may[1]))
    return found


def subpackages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def all_modules() -> list[str]:
    """Every module of the package, dotted below ``roomkeeper`` (``kernel.parsers``)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found.append(".".join(parts))
    return sorted(found)


def unit(module: str) -> str:
    """The layering unit a module belongs to: its subpackage, or itself at the top."""
    return module.split(".", maxsplit=1)[0]


def source(module: str) -> Path:
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported(module: str) -> set[str]:
    """The roomkeeper modules ``module`` imports anywhere in its text (lazy imports too)."""
    tree = ast.parse(source(module).read_text())
    known = set(all_modules())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module != "roomkeeper" and not node.module.startswith("roomkeeper."):
                continue
            base = node.module.removeprefix("roomkeeper").lstrip(".")
            for alias in node.names:
                child = f"{base}.{alias.name}" if base else alias.name
                if child in known:
                    names.add(child)  # ``from roomkeeper.kernel import parsers``
                elif base:
                    names.add(base)  # ``from roomkeeper.kernel.parsers import Pressure``
        elif isinstance(node, ast.Import):
            names.update(
                a.name.removeprefix("roomkeeper.")
                for a in node.names
                if a.name.startswith("roomkeeper.")
            )
    return names - {module}


def third_party(module: str) -> set[str]:
    tree = ast.parse(source(module).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    return names


def may_import(importer: str) -> set[str]:
    """The units ``importer``'s unit may import, its own included."""
    own = unit(importer)
    if own in BASICS:
        return set(BASICS)
    if own == "ipc":
        return {"ipc"}
    if own == "__main__":
        return {"cli"}
    return {own, *BASICS, *allowed_imports()[own]}


def test_the_map_names_every_subpackage() -> None:
    """A new subpackage must be placed in the docstring's map, and the map names no ghost."""
    assert sorted(allowed_imports()) == subpackages()


def test_the_top_level_holds_only_the_public_face_and_the_basics() -> None:
    """At most ten modules at the top; everything else lives in a subpackage one level deep."""
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"modules at the top that belong in a subpackage: {top - TOP_LEVEL}"
    assert len(top) <= 10
    deeper = [m for m in all_modules() if m.count(".") > 1]
    assert deeper == [], f"subpackages are one level deep: {deeper}"


@pytest.mark.parametrize("package", subpackages())
def test_subpackages_re_export_nothing(package: str) -> None:
    """A subpackage's ``__init__`` holds its docstring only: public names live in ``roomkeeper``."""
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text())
    body = [
        n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    body = [n for n in body if not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert body == []


@pytest.mark.parametrize("module", [m for m in all_modules() if m not in UNLAYERED])
def test_imports_point_down(module: str) -> None:
    """A module imports only from its own unit, the basics, or what the map allows its unit."""
    allowed = may_import(module)
    upward = sorted(m for m in imported(module) if unit(m) not in allowed)
    assert upward == [], f"{module} imports what its package may not: {upward}"


def test_no_import_circle() -> None:
    """No chain of imports, lazy ones included, leads from a module back to itself."""
    graph = {m: imported(m) for m in all_modules() if m not in UNLAYERED}
    circles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert circles == []


@pytest.mark.parametrize("module", all_modules())
def test_only_the_api_imports_the_web_framework(module: str) -> None:
    """FastAPI and Starlette stay inside ``api``: the rest of the code is plain Python."""
    if unit(module) == "api":
        return
    assert third_party(module).isdisjoint(WEB_FRAMEWORKS)


@pytest.mark.parametrize("package", subpackages())
def test_each_package_imports_alone(package: str) -> None:
    """Importing a package's modules in a fresh interpreter loads nothing it may not import."""
    wanted = [m for m in all_modules() if unit(m) == package]
    probe = (
        "import importlib, json, sys\n"
        f"for m in {wanted!r}: importlib.import_module('roomkeeper.' + m)\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.startswith('roomkeeper.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = {unit(k.removeprefix("roomkeeper.")) for k in json.loads(done.stdout)}
    allowed = {package, *BASICS, *allowed_imports()[package]}
    assert sorted(loaded - allowed) == [], f"{package} pulls in {sorted(loaded - allowed)}"


# SQL as this project writes it; an HTTP method alone ("DELETE") is not SQL.
SQL = re.compile(
    r"\bSELECT\b.+\bFROM\b"
    r"|\bINSERT\s+(?:OR\s+\w+\s+)?INTO\b"
    r"|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b"
    r"|\bCREATE\s+(?:TABLE|INDEX)\b"
    r"|\bPRAGMA\b",
    flags=re.S,
)


def sql_strings(module: str) -> list[str]:
    """The string constants of a module (f-strings' literal parts too) that read as SQL."""
    tree = ast.parse(source(module).read_text())
    return [
        f"line {node.lineno}: {node.value[:60]!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value)
    ]


def test_no_sql_outside_the_journal() -> None:
    """Every SQL string lives in ``journal``, behind named operations; nobody else writes SQL."""
    found = {m: sql_strings(m) for m in all_modules() if unit(m) != "journal"}
    leaks = {m: s for m, s in found.items() if s}
    assert leaks == {}, f"SQL outside the journal (give it a named operation there): {leaks}"


def test_the_sql_check_tells_sql_from_http() -> None:
    """The check above finds each form of SQL, and lets an HTTP method or prose through."""
    for text in (
        "SELECT id FROM jobs",
        "INSERT OR REPLACE INTO markers (kind) VALUES (?)",
        "UPDATE jobs SET state=?",
        "DELETE FROM markers WHERE id=?",
        "CREATE TABLE IF NOT EXISTS jobs (id TEXT)",
        "PRAGMA journal_mode=WAL",
    ):
        assert SQL.search(text), text
    for text in ("DELETE", "an HTTP DELETE of the agent's session", "update the settings"):
        assert not SQL.search(text), text


# ------------------------------------------------------------- tests and benchmarks

ROOT = PACKAGE.parent.parent
TESTS = ROOT / "tests"
BENCHMARKS = ROOT / "benchmarks"


def imported_names(text: str) -> list[tuple[int, str]]:
    """Each module a source text imports anywhere (lazy imports too), dotted, with its line.

    ``from tests import test_a`` names ``tests.test_a``; a relative import keeps
    its dots (``.test_a``), since what it reaches depends on where it runs.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append((node.lineno, base))
            joiner = "" if base.endswith(".") else "."
            found += [(node.lineno, f"{base}{joiner}{a.name}") for a in node.names]
    return found


def outermost(found: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """``found`` less each name whose module is already there from the same line."""
    return sorted(
        (line, name)
        for line, name in set(found)
        if not any(line == at and name.startswith(f"{other}.") for at, other in found)
    )


def imports_of_test_modules(text: str) -> list[str]:
    """The test modules (``test_*``) a source text imports, however it reaches them."""
    found = [
        (line, name)
        for line, name in imported_names(text)
        if any(part.startswith("test_") for part in name.split("."))
    ]
    return [f"line {line}: {name}" for line, name in outermost(found)]


@pytest.mark.parametrize("path", sorted(TESTS.glob("*.py")), ids=lambda p: p.name)
def test_no_test_module_imports_another(path: Path) -> None:
    """What two test modules share lives in conftest.py or a helper module, never in either."""
    found = imports_of_test_modules(path.read_text())
    assert found == [], f"{path.name} imports a test module (move the helper out): {found}"


def test_the_test_import_check_finds_each_form() -> None:
    """The check above finds a test module by any import, lazy ones too, and lets helpers by."""
    for text in (
        "from tests.test_crash import crash_cycle",
        "import tests.test_crash",
        "from tests import test_crash",
        "from .test_crash import crash_cycle",
        "from . import test_crash",
        "from test_crash import crash_cycle",
        "def f():\n    from tests.test_supervisor import serve\n",
    ):
        assert imports_of_test_modules(text), text
    for text in (
        "from tests.gateways import running_gateway",
        "from roomkeeper import testing",
        "from roomkeeper.testing import FakeClock",
        "import pytest",
    ):
        assert imports_of_test_modules(text) == [], text


def foreign_to_benchmarks(text: str) -> list[str]:
    """What a benchmark imports beyond roomkeeper, the standard library, installed
    distributions and the modules beside it in ``benchmarks/``."""
    own = {p.stem for p in BENCHMARKS.glob("*.py")}
    repository = {p.stem for p in ROOT.iterdir() if p.suffix in ("", ".py")}
    repository |= {p.stem for p in TESTS.glob("*.py")}  # tests' helpers by their bare names
    installed = set(importlib.metadata.packages_distributions())
    found = []
    for line, name in outermost(imported_names(text)):
        top = name.split(".")[0]
        if name.startswith("."):
            found.append(f"line {line}: {name} (a benchmark is a script: no relative import)")
        elif top in own or top in sys.stdlib_module_names or top == "roomkeeper":
            continue
        elif top in repository:
            found.append(f"line {line}: {name} (the repository's, outside the package)")
        elif top not in installed:
            found.append(f"line {line}: {name} (no installed distribution holds it)")
    return found


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_benchmarks_stand_alone(path: Path) -> None:
    """A benchmark imports the package, the standard library, third-party code and its own
    helpers in ``benchmarks/``: never ``tests`` or anything else of the repository."""
    found = foreign_to_benchmarks(path.read_text())
    assert found == [], f"{path.name} reaches outside the package and benchmarks/: {found}"


def test_the_benchmark_import_check_finds_each_form() -> None:
    """The check above finds tests (their helpers by bare name too) and a relative import, and
    lets the package, stdlib, third-party code and benchmarks' own modules by."""
    for text in (
        "from tests.gateways import running_gateway",
        "import tests.test_crash",
        "from tests import ray_cluster",
        "from gateways import running_gateway",
        "from . import swarmgen",
        "def f():\n    from tests.ray_cluster import local_cluster\n",
    ):
        assert foreign_to_benchmarks(text), text
    for text in (
        "from roomkeeper.units import parse_size",
        "import httpx, psutil, argparse",
        "from bench_swarm import run_in_group",
        "from live_gateway import running_gateway",
    ):
        assert foreign_to_benchmarks(text) == [], text


MOST_PARAMETERS = 8  # more is a sign the settings record is missing
MOST_GATEWAY_CLASS_LINES = 300  # the gateway's classes stay one concept each


def constructor_parameters(node: ast.ClassDef) -> int | None:
    """How many parameters the class's ``__init__`` takes besides ``self`` (``*args`` and
    ``**kwargs`` count one each); None when it defines none."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            args = item.args
            named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            return len(named) - 1 + (args.vararg is not None) + (args.kwarg is not None)
    return None


def test_no_constructor_takes_more_than_eight_parameters() -> None:
    """Every ``__init__`` in the package takes at most eight parameters besides ``self``: a
    part takes its settings as a record, passed whole, not one keyword per value."""
    wide = []
    for module in all_modules():
        for node in ast.walk(ast.parse(source(module).read_text())):
            if isinstance(node, ast.ClassDef):
                count = constructor_parameters(node)
                if count is not None and count > MOST_PARAMETERS:
                    wide.append(f"{module}.{node.name}: {count}")
    assert wide == [], f"constructors over {MOST_PARAMETERS} parameters: {wide}"


def test_no_gateway_class_is_longer_than_three_hundred_lines() -> None:
    """Each class in ``gateway`` is one concept: none runs past 300 lines."""
    long = []
    for module in (m for m in all_modules() if unit(m) == "gateway"):
        for node in ast.walk(ast.parse(source(module).read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MOST_GATEWAY_CLASS_LINES:
                    long.append(f"{module}.{node.name}: {lines}")
    assert long == [], f"gateway classes over {MOST_GATEWAY_CLASS_LINES} lines: {long}"
