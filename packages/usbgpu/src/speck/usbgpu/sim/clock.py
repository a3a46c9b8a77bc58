"""Discrete-event virtual clock shared by the USB pipes, the bridge firmware and the GPU engine."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class VirtualClock:
    """A time-ordered event queue; `now` is in nanoseconds and only moves forward.

    Events are plain callables. Nothing is ever removed from the heap: an event that became irrelevant (a cancelled
    transfer, a reset engine) checks its own state when it fires and does nothing, which keeps scheduling O(log n).
    """

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def at(self, when: float, fn: Callable[[], None]) -> None:
        """Run `fn` at virtual time `when` (never earlier than now)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def peek(self) -> float | None:
        """Time of the next event, or None if nothing is scheduled."""
        return self._heap[0][0] if self._heap else None

    def run_next(self) -> None:
        """Advance to the earliest event and run it."""
        when, _, fn = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        self.events_run += 1
        fn()

    def advance_to(self, when: float) -> None:
        """Move time forward to `when` without running anything (callers ensure no event is due before it)."""
        self.now = max(self.now, when)
