"""The closed vocabularies: each word with its owner and its description, one list for all."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from roomkeeper.api import words
from roomkeeper.api.models import ERROR_REASONS
from roomkeeper.api.responses import JOB_CODES
from roomkeeper.api.words import JOB_REASONS, REASONS, WORDS_SLOT, WireReason, embed_words
from roomkeeper.cluster.backend import ClusterReason
from roomkeeper.errors import UsageError
from roomkeeper.gateway.headlines import HEADLINES
from roomkeeper.guard.rule import ADMITTING_REASONS, Reason, Word
from roomkeeper.jobs.spec import SchedulerReason
from roomkeeper.journal.jobs import JournalReason
from roomkeeper.relief.ladder import PressureReason

README = Path(__file__).resolve().parent.parent / "README.md"
VOCABULARIES = (Reason, SchedulerReason, PressureReason, ClusterReason, JournalReason)
WORDS_BLOCK = re.compile(r'<script id="words" type="application/json">(.*?)</script>', re.S)


def _page() -> str:
    return (resources.files("roomkeeper.api") / "web" / "health.html").read_text()


@pytest.mark.parametrize("vocabulary", VOCABULARIES, ids=lambda v: v.__name__)
def test_every_word_has_a_one_line_description(vocabulary: type[Word]) -> None:
    """Every word carries a description for people: one short line, not its code."""
    for word in vocabulary:
        text = word.description
        assert isinstance(text, str), word
        assert text.strip() == text and text, f"{word}: no description"
        assert "\n" not in text and len(text) <= 80, f"{word}: not one short line: {text!r}"
        assert text != word.value, f"{word}: its description only repeats its code"


def test_every_vocabulary_is_composed_for_the_wire() -> None:
    """The API's words are every owner's, each code once, with no vocabulary left out."""
    assert set(Word.__subclasses__()) == set(VOCABULARIES)
    assert {type(w) for w in JOB_REASONS} == set(VOCABULARIES)
    codes = [w.value for w in JOB_REASONS]
    assert len(codes) == len(set(codes)), f"a code used twice: {codes}"
    assert [w.value for w in REASONS] == [w.value for w in WireReason]
    assert list(JOB_CODES) == codes
    assert set(ERROR_REASONS) >= {w.value for w in REASONS}


def test_the_document_lists_the_closed_reasons_in_their_first_order() -> None:
    """The document's ``Reason`` is the same closed enum, in the same order, as before the split."""
    schema = TypeAdapter(WireReason).json_schema()
    assert schema["title"] == "Reason"
    assert schema["enum"] == [
        *("ok", "no_container", "off", "memory", "disk", "unknown"),
        *("cpu", "slots", "owner_slots", "queued", "shutdown", "held", "queue_full"),
        *("owner_queue_full", "pressure", "memory_pressure", "on_trial", "cluster_unreachable"),
    ]


def test_the_readme_names_every_reason() -> None:
    """README.md names each reason a job or an error may carry, in backticks."""
    text = README.read_text()
    missing = [w.value for w in JOB_REASONS if f"`{w.value}`" not in text]
    assert missing == [], f"reasons README.md does not name: {missing}"


def test_every_refusing_reason_of_the_rule_has_a_headline() -> None:
    """Needs-you has a headline for each reason of the rule (else a refusal would say "ok")."""
    missing = [r.value for r in Reason if r not in HEADLINES]
    assert missing == [], f"give these a headline in gateway/headlines.py HEADLINES: {missing}"
    assert {HEADLINES[r] for r in ADMITTING_REASONS} <= {"ok", "guard off"}
    assert all(HEADLINES[r] != "ok" for r in Reason if r not in ADMITTING_REASONS)


def test_the_page_is_served_the_same_words() -> None:
    """The Health page has no list of its own: the server fills in every job reason's words."""
    page = _page()
    assert WORDS_SLOT in page
    assert "memory_pressure" not in page  # no hand-written copy of the words
    served = WORDS_BLOCK.search(embed_words(page))
    assert served is not None
    assert json.loads(served.group(1)) == {"reasons": {w.value: w.description for w in JOB_REASONS}}


def test_the_served_words_cannot_end_their_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """A description with markup in it stays data: ``</script>`` cannot close the words' block."""
    monkeypatch.setattr(words, "descriptions", lambda: {"x": "</script><b>&"})
    filled = embed_words(WORDS_SLOT)
    assert filled.count("</script>") == 1 and "<b>" not in filled
    block = WORDS_BLOCK.search(filled)
    assert block is not None
    assert json.loads(block.group(1)) == {"reasons": {"x": "</script><b>&"}}


def test_a_page_without_the_words_block_is_refused() -> None:
    """Serving a page that has lost its words' block fails loudly, not with bare codes."""
    with pytest.raises(UsageError, match='has no <script id="words"'):
        embed_words("<!doctype html><title>roomkeeper</title>")
