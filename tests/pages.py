"""The Health page in Debian's chromium: where it is, how it starts, how long a page may take."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


PAGE_TIMEOUT_MS = 20_000
