"""The closed vocabularies as the API and the Health page give them, put together from their owners.

Each word lives with the part that decides it, with its description for
people: the admission rule's :class:`~roomkeeper.guard.rule.Reason`, the
scheduler's :class:`~roomkeeper.jobs.spec.SchedulerReason`, the relief ladder's
:class:`~roomkeeper.relief.ladder.PressureReason`, the cluster's
:class:`~roomkeeper.cluster.backend.ClusterReason` and the journal's
:class:`~roomkeeper.journal.jobs.JournalReason`.  ``api`` is the layer that may
import them all, so the wire's one closed ``Reason`` is composed here, and the
Health page is served the same words (:func:`embed_words`), never a copy of its
own.  Adding a word is one line in its owner's class.
"""

from __future__ import annotations

import enum
import json

from roomkeeper.cluster.backend import ClusterReason
from roomkeeper.errors import UsageError
from roomkeeper.guard.rule import Reason, Word
from roomkeeper.jobs.spec import SchedulerReason
from roomkeeper.journal.jobs import JournalReason
from roomkeeper.relief.ladder import PressureReason

REASONS: tuple[Word, ...] = (*Reason, *SchedulerReason, *PressureReason, *ClusterReason)
"""Every word a decision or a waiting job carries, in the order the document lists them."""

JOB_REASONS: tuple[Word, ...] = (*REASONS, *JournalReason)
"""Why a job waits or ended: :data:`REASONS`, and the journal's ``stop_requested`` (a person
stopped it) on a job of an earlier run."""

# The members are the owners' words, so mypy cannot list them: the class is a field type
# for pydantic, which validates and documents it as the closed enum named ``Reason``.
WireReason = enum.Enum(  # type: ignore[misc]
    "Reason", [(w.name, w.value) for w in REASONS], module=__name__
)
WireReason.__doc__ = "Why a decision came out as it did: one closed vocabulary for every layer."

WORDS_SLOT = '<script id="words" type="application/json"></script>'
"""Where the Health page takes its words: an empty data block the server fills."""


def descriptions() -> dict[str, str]:
    """Each job reason's code and its description for people, as the Health page shows them."""
    return {w.value: w.description for w in JOB_REASONS}


def embed_words(page: str) -> str:
    """``page`` with :func:`descriptions` in its :data:`WORDS_SLOT`, escaped for a script block.

    Raises:
        UsageError: the page has no such block (it would show bare codes).
    """
    if WORDS_SLOT not in page:
        raise UsageError(f"the Health page has no {WORDS_SLOT} to fill", name="page")
    data = json.dumps({"reasons": descriptions()}, sort_keys=True)
    # Inside <script>, "</" would end the block: no <, > or & goes in as itself.
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return page.replace(WORDS_SLOT, WORDS_SLOT.replace("></", f">{data}</"), 1)
