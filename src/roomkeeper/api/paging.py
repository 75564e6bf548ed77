"""Pages of a long list: ``limit`` and an opaque ``cursor`` in, the next page's cursor out.

A list answer stays a JSON array; when more items follow, the answer carries
the next page's cursor in ``X-Next-Cursor`` and a ``Link: <...>; rel="next"``
header (RFC 8288), so a client that never pages still gets the first page and
is told that more exist.  The cursor is the last item's sort key (keyset
paging): items added meanwhile never shift a page, and no item is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Query, Response

from roomkeeper.errors import UsageError

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
NEXT_HEADER = "X-Next-Cursor"

Limit = Annotated[
    int, Query(ge=1, le=MAX_LIMIT, description=f"Items per page (default {DEFAULT_LIMIT}).")
]
# A cursor is the last item's position, written out: its time exactly as Python writes a
# float, "~", its id.  Every text the pattern allows is a position, so a schema-valid
# cursor is never refused (a made-up one just starts the page there).
CURSOR_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?(e[+-]?[0-9]{1,3})?~[A-Za-z0-9._:@-]{1,200}$"
Cursor = Annotated[
    str | None,
    Query(
        min_length=3,
        max_length=260,
        pattern=CURSOR_PATTERN,
        description=f"The {NEXT_HEADER} of the previous page.",
    ),
]
PAGED_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "headers": {
            NEXT_HEADER: {
                "description": "Present when more items follow: pass it as `cursor`.",
                "schema": {"type": "string"},
            },
            "Link": {
                "description": 'The next page, as `<url>; rel="next"`, when more follow.',
                "schema": {"type": "string"},
            },
        }
    }
}

SortKey = tuple[float, str]


def encode_cursor(key: SortKey) -> str:
    """The text of a sort key (newest-first order: the last item shown)."""
    return f"{key[0]!r}~{key[1]}"


def decode_cursor(text: str | None) -> SortKey | None:
    """The sort key a cursor names; None for the first page.

    Raises:
        UsageError: the text is no position (the API's schema refuses it first).
    """
    if text is None:
        return None
    if re.fullmatch(CURSOR_PATTERN, text) is None:
        raise UsageError(
            "cursor is not a position: pass the X-Next-Cursor header of the previous page "
            "unchanged, or leave cursor out for the first page",
            name="cursor",
        )
    at, ident = text.split("~", 1)
    return float(at), ident


def newest_first_page(
    items: Sequence[dict[str, Any]], key: str, limit: int, after: SortKey | None
) -> tuple[list[dict[str, Any]], SortKey | None]:
    """The page of ``items`` (newest first by ``key``, then id) past ``after``; the cursor
    key of the next page, or None when this is the last."""
    ordered = sorted(items, key=lambda i: (i[key], i["id"]), reverse=True)
    if after is not None:
        ordered = [i for i in ordered if (i[key], i["id"]) < after]
    page = ordered[:limit]
    more = len(ordered) > limit
    return page, ((page[-1][key], page[-1]["id"]) if more and page else None)


def say_next(
    response: Response, path: str, query: Mapping[str, Any], next_key: SortKey | None
) -> None:
    """Put the next page's cursor and link on ``response`` when there is one."""
    if next_key is None:
        return
    cursor = encode_cursor(next_key)
    response.headers[NEXT_HEADER] = cursor
    asked = {k: v for k, v in query.items() if v is not None and k != "cursor"}
    response.headers["Link"] = f'<{path}?{urlencode({**asked, "cursor": cursor})}>; rel="next"'
