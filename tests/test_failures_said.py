"""A failure a loop goes on past is logged once, with its cause; never swallowed unseen."""

from __future__ import annotations

import asyncio
import logging

import pytest

from roomkeeper.errors import say_failure_once
from roomkeeper.gateway.background import Background


def test_a_failure_is_said_once_per_cause(caplog: pytest.LogCaptureFixture) -> None:
    """The first time at error with its cause; repeats at debug; another cause at error."""
    caplog.set_level(logging.DEBUG, logger="roomkeeper")
    for _ in range(3):
        say_failure_once("the test loop", OSError(28, "No space left on device"))
    say_failure_once("the test loop", ValueError("another cause"))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "the test loop failed (it goes on, and tries again): OSError: "
        "[Errno 28] No space left on device",
        "the test loop failed (it goes on, and tries again): ValueError: another cause",
    ]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 2


class _Failing:
    """Stand-ins for the resume loop's parts: each of its steps raises."""

    def __init__(self) -> None:
        self.unsaved = {"job-1": 0.0}

    def retry_unsaved(self) -> int:
        raise OSError(5, "Input/output error")

    def resume_next(self) -> str | None:
        raise RuntimeError("the journal went away")

    def save_owed(self) -> None:
        raise OSError(28, "No space left on device")

    async def catch_up(self) -> None:
        return None


def test_the_resume_loop_says_why_it_failed_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """Resume and retry failures reach the log with their causes; the loop keeps turning."""
    caplog.set_level(logging.DEBUG, logger="roomkeeper")
    failing = _Failing()
    background = Background(
        startup=failing,  # type: ignore[arg-type]
        jobs=failing,  # type: ignore[arg-type]
        leases=failing,  # type: ignore[arg-type]
        doubt=failing,  # type: ignore[arg-type]
        may_resume=lambda: True,
    )

    async def a_few_turns() -> None:
        task = asyncio.create_task(background._resume_loop())
        await asyncio.sleep(1.2)  # two turns and more
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(a_few_turns())
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("resuming deferred work failed" in e and "journal went away" in e for e in errors)
    assert any(
        "saving unsaved job changes again failed" in e and "Input/output" in e for e in errors
    )
    assert any("saving unsaved lease changes again failed" in e and "No space" in e for e in errors)
    assert len(errors) == 3  # each said once, however many turns
