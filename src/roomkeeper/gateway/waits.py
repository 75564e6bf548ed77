"""How long jobs waited before their start: the histogram ``GET /metrics`` shows."""

from __future__ import annotations

WAIT_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
"""The histogram's upper bounds, in seconds."""


class WaitTimes:
    """Each started job's wait, counted as Prometheus histograms must be: cumulative.

    Attributes:
        buckets: how many waits were at most each bound of :data:`WAIT_BUCKETS`.
        sum: the waits' total, in seconds.
        count: how many waits were counted.
    """

    def __init__(self) -> None:
        self.buckets = [0] * len(WAIT_BUCKETS)
        self.sum = 0.0
        self.count = 0

    def add(self, wait: float) -> None:
        """One job's wait before its start."""
        self.sum += wait
        self.count += 1
        for i, bound in enumerate(WAIT_BUCKETS):
            if wait <= bound:
                self.buckets[i] += 1
