"""The baseline, watched: memory the container holds that none of our live work explains.

::

    baseline = used - our running jobs' footprints - what our granted leases reserve

A finished turn whose session nobody asks back, a hook never set, a leak
elsewhere: the memory stays after the work ends, and every ending leaves
the baseline higher.  Admission only sees less and less room; this watch
says why, from records taken after each job or lease ends and at quiet
moments (nothing running, nothing leased).

The rule, with ``share`` = ROOMKEEPER_BASELINE_GROWTH_PERCENT of the memory
line and ``N`` = ROOMKEEPER_BASELINE_ENDINGS::

    then = the lowest *upper* baseline recorded at least N endings ago
           (after the first ending: what starts beside the gateway is not growth)
    now  = the lowest baseline of the last RECENT_RECORDS records
    memory not given back  when  now - then > share
    given back again       when  the lowest upper baseline of those records
                                 - then <= share / 2

The *upper* baseline counts a granted lease's memory as baseline (``used -
footprints``): a lease reserves its estimate before its turn has allocated
it, so the plain baseline reads low while leases are young, and a low
reading taken then would make the next quiet moment look like growth.
Comparing the plain baseline now with the upper one then, a growth is only
said when no lease could explain it.  ``now`` is the lowest of the last few
records, so one reading taken before a freed session was unmapped is not
taken for memory kept.  Given back is said from the upper baseline too, so
young leases never make memory look given back while it is still held.

Nothing here reads the kernel or a clock: the gateway
(:mod:`roomkeeper.gateway.baseline`) takes the readings and acts on what
:meth:`BaselineWatch.record` returns.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from roomkeeper.config import BaselineSettings, read_baseline_settings

RECENT_RECORDS = 3  # "has not come back": the lowest of these is the baseline now


@dataclass(frozen=True, slots=True)
class BaselineRecord:
    """One record of the baseline.

    Attributes:
        at: wall-clock seconds.
        used: the container's used memory (the guard's).
        footprints: our running jobs' footprints together.
        leased: what our granted leases reserve together.
        line: the guard's memory line then.
    """

    at: float
    used: int
    footprints: int
    leased: int
    line: int

    @property
    def baseline(self) -> int:
        """Memory no live work of ours explains (negative while leases reserve more than
        their turns hold yet)."""
        return self.used - self.footprints - self.leased

    @property
    def upper(self) -> int:
        """The baseline with every lease's memory counted as baseline: never below it."""
        return self.used - self.footprints


@dataclass(frozen=True, slots=True)
class NotGivenBack:
    """The moment the rule fired: its numbers (the recovery history keeps them).

    Attributes:
        then_bytes: the baseline it is measured from (``then``).
        now_bytes: the baseline now.
        endings: the endings counted between the two.
        share_bytes: the rise it had to pass.
    """

    then_bytes: int
    now_bytes: int
    endings: int
    share_bytes: int


@dataclass(frozen=True, slots=True)
class BaselineStatistics:
    """A snapshot of the watch.

    Attributes:
        baseline_bytes: the latest record's baseline (None before the first).
        then_bytes: the baseline growth is measured from (None until N endings passed).
        endings: job and lease endings counted since the gateway started.
        records: records taken.
        not_given_back: the rule holds now.
        fired: how many times the rule began to hold.
        judged_bytes: what the rule last measured against ``then``: the lowest recent
            baseline, leases' memory counted in while it holds (None until it judged).
    """

    baseline_bytes: int | None
    then_bytes: int | None
    endings: int
    records: int
    not_given_back: bool
    fired: int
    judged_bytes: int | None = None


class BaselineWatch:
    """Keeps the baseline's records and judges them; thread-safe.

    Args:
        settings: the ROOMKEEPER_BASELINE_* variables, read afresh for each record.
    """

    def __init__(self, settings: Callable[[], BaselineSettings] = read_baseline_settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._endings = 0
        self._records = 0
        self._latest: BaselineRecord | None = None
        self._recent: deque[tuple[int, int]] = deque(maxlen=RECENT_RECORDS)  # (plain, upper)
        # The lowest upper baseline of each ending count not yet N endings old: only the
        # lowest of a count can ever be "then", so quiet moments add nothing here.
        self._young: dict[int, int] = {}
        self._then: tuple[int, int] | None = None  # (upper baseline, ending count)
        self._holds = False
        self._fired = 0
        self._judged: int | None = None

    def ended(self, count: int = 1) -> None:
        """Count job or lease endings (the record taken after them follows)."""
        with self._lock:
            self._endings += count

    def record(self, record: BaselineRecord) -> NotGivenBack | None:
        """Keep one record and judge; what fired, the moment the rule begins to hold."""
        settings = self._settings()
        with self._lock:
            self._records += 1
            self._latest = record
            self._recent.append((record.baseline, record.upper))
            endings = self._endings
            if endings > 0:  # before any ending, the start-up: helpers still arriving
                low = self._young.get(endings)
                self._young[endings] = record.upper if low is None else min(low, record.upper)
            for count in [c for c in self._young if endings - c >= settings.endings]:
                upper = self._young.pop(count)
                if self._then is None or upper < self._then[0]:
                    self._then = (upper, count)
            if self._then is None:
                return None
            now = min(plain for plain, _ in self._recent)
            share = int(record.line * settings.growth_percent / 100)
            grown = now - self._then[0]
            if self._holds:
                held = min(upper for _, upper in self._recent)
                self._judged = held
                self._holds = held - self._then[0] > share // 2
                return None
            self._judged = now
            if grown <= share:
                return None
            self._holds = True
            self._fired += 1
            return NotGivenBack(self._then[0], now, endings - self._then[1], share)

    def statistics(self) -> BaselineStatistics:
        """The latest baseline, what growth is measured from, the endings, whether it holds."""
        with self._lock:
            return BaselineStatistics(
                # Below zero only while leases reserve more than their turns hold yet.
                baseline_bytes=None if self._latest is None else max(0, self._latest.baseline),
                then_bytes=None if self._then is None else self._then[0],
                endings=self._endings,
                records=self._records,
                not_given_back=self._holds,
                fired=self._fired,
                judged_bytes=self._judged,
            )
