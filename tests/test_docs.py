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
# kept elsewhere, a source document by number, a tracker's issue number, a path
# outside the checkout.  The project's own design is docs/DESIGN.md.
_SEED = "se" + "ed"  # spelled apart so that this file does not match itself
FOREIGN = re.compile(
    rf"\b{_SEED} ?0\d\d\b|\b{_SEED}'s\b|\bissue \d+\b|\b(?:the|this) issue\b"
    r"|HOUSE_STYLE|house style|(?<!docs/)\bDESIGN\.md\b"
    r"|\.\./shared|\bshared/(?:fixtures|seeds|v2vm)\b",
    flags=re.IGNORECASE,
)


def _texts() -> list[Path]:
    """The files a reader of the repository reads: code, docs, examples, benchmarks' code."""
    found = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("examples/*")]
    for folder in ("src", "tests", "benchmarks"):
        found += (ROOT / folder).rglob("*.py")
    return sorted(p for p in found if p.is_file() and p != Path(__file__).resolve())


@pytest.mark.parametrize("path", _texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pointer_to_what_is_not_in_the_repository(path: Path) -> None:
    """No docstring, comment or document names a document, source or issue number elsewhere."""
    lines = path.read_text(errors="replace").splitlines()
    found = [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if FOREIGN.search(line)]
    assert found == [], f"say it in the sentence, or point at docs/DESIGN.md: {found}"


def test_the_check_finds_each_kind_of_foreign_pointer() -> None:
    """The pattern above catches each form, and lets ordinary words through."""
    for text in (
        f"as in {_SEED} 000",
        f"the {_SEED}'s bounds",
        "fixed in issue 14",
        "the 2 s the issue allows",
        "see DESIGN.md",
        "HOUSE_STYLE 7",
        "../shared/v2vm/run",
    ):
        assert FOREIGN.search(text), text
    for text in ("see docs/DESIGN.md", "a random seed=3", "the tree's seeds of members"):
        assert not FOREIGN.search(text), text


def test_the_architecture_names_every_module() -> None:
    """docs/ARCHITECTURE.md names each module of the package, in backticks, by its stem."""
    text = ARCHITECTURE.read_text()
    stems = sorted({p.stem for p in PACKAGE.rglob("*.py") if p.stem != "__init__"})
    missing = [s for s in stems if f"`{s}`" not in text and f"`{s}." not in text]
    assert missing == [], f"modules docs/ARCHITECTURE.md does not name: {missing}"
