"""Running ``git``: the one subprocess every workspace operation goes through.

No library is needed: the operations are a handful of porcelain commands
whose output is meant to be parsed.  Every call has a deadline, no pager, no
prompt and the C locale, so a hung credential helper or a translated message
cannot hold a launch round or fool a parser.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

GIT_TIMEOUT_S = 120.0  # a worktree of a large repository takes a while to check out


@dataclass(frozen=True, slots=True)
class GitResult:
    """What one ``git`` call said: its exit status, output and error text."""

    code: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        """Whether git exited 0."""
        return self.code == 0

    def said(self) -> str:
        """The first line of git's complaint, for an error message."""
        text = (self.err or self.out).strip()
        return text.splitlines()[0] if text else f"git exited {self.code}"


def git(cwd: str, *args: str, timeout: float = GIT_TIMEOUT_S) -> GitResult:
    """Run ``git -C cwd ARGS`` and return what it said (never raises for git's own failure).

    A git that cannot be run at all (not installed, past its deadline) reads
    as a failure with the reason in ``err``, so every caller has one path.
    """
    env = {
        **os.environ,
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_PAGER": "cat",
        "GIT_OPTIONAL_LOCKS": "0",  # status must not take the index lock of a running job's tree
    }
    try:
        done = subprocess.run(
            ["git", "-C", cwd, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return GitResult(-1, "", f"git could not be run: {err}")
    return GitResult(done.returncode, done.stdout, done.stderr)
