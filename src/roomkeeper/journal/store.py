"""What a table's named operations need of the journal: a durable write and a read.

:class:`roomkeeper.journal.database.Journal` provides both (its writer
thread with group commit, one reading connection per thread).  Each table
module (``jobs``, ``leases``, ``markers``, ``calls``, ``history``, ``worktrees``,
``sizes``) writes its operations
as a mixin of :class:`Store`, so that a table's schema, its SQL and its
named operations live in one module, and ``Journal`` gathers them.  Each
write operation is one function of a connection, so one transaction: what
must be saved together (an outcome and the end of its pending marker) cannot
be split by a caller.
"""

from __future__ import annotations

import abc
import concurrent.futures
import sqlite3
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Store(abc.ABC):
    """The journal's two primitives, as the table mixins use them."""

    @abc.abstractmethod
    def submit(self, write: Callable[[sqlite3.Connection], T]) -> concurrent.futures.Future[T]:
        """Queue a write; the future resolves once it is committed durably (or fails)."""

    @abc.abstractmethod
    def _read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read now, on the calling thread's own connection (not for the event loop)."""
