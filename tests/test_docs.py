"""The repository's words speak of the repository: every module has its place in the
architecture document, and nothing points at documents or numbers a reader cannot open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import roomkeeper

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(roomkeeper.__file__).parent
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"

# Pointers a reader of the repository cannot follow: a design or style document
# kept elsewhere, a source document by number, a tracker's issue number (``issue 3``,
# ``issue-12b``, ``#15``), a path outside the checkout or on one machine only
# (``/work/...``, ``/tmp/...``, ``/root/...``).  The project's own design is docs/DESIGN.md;
# history is told by commit and date.
_SEED = "se" + "ed"  # spelled apart so that this file does not match itself
FOREIGN = re.compile(
    rf"\b{_SEED} ?0\d\d\b|\b{_SEED}'s\b"
    r"|\bissues?[- ]?#?\d+|\b(?:the|this) issue\b|(?<![\w&/])#\d+\b"
    r"|HOUSE_STYLE|house style|(?<!docs/)\bDESIGN\.md\b"
    r"|\.\./shared|\bshared/(?:fixtures|seeds|v2vm)\b|\bv2vm\b"
    r"|(?<![\w.~-])/(?:work|tmp|root)/",
    flags=re.IGNORECASE,
)

# The one line that may name a path outside the checkout: CI calls the runner that boots
# a cgroup v2 kernel where it finds it beside the checkout, unless told otherwise.  It is a
# command .ci/run runs, not a pointer for a reader, and everything else says $V2_RUNNER.
CALLS_OUTSIDE = {".ci/run": {"V2_RUNNER=${V2_RUNNER:-../shared/v2vm/run}"}}


def _texts() -> list[Path]:
    """The files a reader of the repository reads: code, docs, examples, benchmarks' code
    and results, and CI's script."""
    found = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/*")]
    found += [ROOT / "benchmarks" / "RESULTS.md", ROOT / ".ci" / "run"]
    for folder in ("src", "tests", "benchmarks"):
        found += (ROOT / folder).rglob("*.py")
    return sorted(p for p in found if p.is_file() and p != Path(__file__).resolve())


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pointer_to_what_is_not_in_the_repository(path: Path) -> None:
    """No docstring, comment or document names a document, source or issue number elsewhere."""
    lines = path.read_text(errors="replace").splitlines()
    allowed = CALLS_OUTSIDE.get(str(path.relative_to(ROOT)), set())
    found = [
        f"{n}: {line.strip()}"
        for n, line in enumerate(lines, 1)
        if FOREIGN.search(line) and line.strip() not in allowed
    ]
    assert found == [], f"say it in the sentence, or point at docs/DESIGN.md: {found}"


def test_the_check_finds_each_kind_of_foreign_pointer() -> None:
    """The pattern above catches each form, and lets ordinary words through."""
    for text in (
        f"as in {_SEED} 000",
        f"the {_SEED}'s bounds",
        "fixed in issue 14",
        "the 2 s the issue allows",
        "## Relief ladder (issue 12, part b)",
        "on branch issue-12a",
        "Issues 3 and 4",
        "as in #23",
        "see DESIGN.md",
        "HOUSE_STYLE 7",
        "../shared/v2vm/run",
        "the v2vm runner",
        "PYTHONPATH=src /work/main/.venv/bin/python",
        "git clone . /tmp/fresh5",
        "cached in /root/.cache",
    ):
        assert FOREIGN.search(text), text
    for text in (
        "see docs/DESIGN.md",
        "a random seed=3",
        "the tree's seeds of members",
        "$V2_RUNNER --limit 3G",
        "PYTHONPATH=src .venv/bin/python benchmarks/bench_ray.py",
        'tempfile.mkdtemp(prefix="rk-ray-", dir="/tmp")',
        "src/roomkeeper/work/tmp/x",
        "at commit 8185447 (2026-12-01)",
        "&#39; in HTML",
    ):
        assert not FOREIGN.search(text), text


def test_the_architecture_names_every_module() -> None:
    """docs/ARCHITECTURE.md names each module of the package, in backticks, by its stem."""
    text = ARCHITECTURE.read_text()
    stems = sorted({p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__"})
    missing = [s for s in stems if f"`{s}`" not in text and f"`{s}." not in text]
    assert missing == [], f"modules docs/ARCHITECTURE.md does not name: {missing}"
