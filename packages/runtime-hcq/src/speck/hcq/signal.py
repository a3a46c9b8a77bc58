"""Timeline signals: a 64-bit counter in memory that only grows, plus the time it last changed.

Commands set a signal to a value when they complete; anything may wait until it reaches a value. Waiters block on
a condition variable, so a waiting thread costs nothing and is woken as soon as the value is written."""

from __future__ import annotations

import ctypes
import itertools
import threading
import time

from speck.hcq.errors import HCQError, HCQValueError, SignalTimeoutError
from speck.hcq.settings import HCQ_TIMEOUT

_ids = itertools.count()


def default_timeout() -> float:
    """Seconds a synchronize/wait blocks before raising SignalTimeoutError: `$HCQ_TIMEOUT`, default 600."""
    return float(HCQ_TIMEOUT.value)


class Signal:
    """A timeline signal: `value` (64-bit, monotonically non-decreasing) and `timestamp` (ns of
    time.perf_counter_ns when a timestamp command last wrote it). `set` only moves forward; `wait` blocks until
    the value is reached, raising SignalTimeoutError (naming the signal, the value awaited and the value seen)."""

    __slots__ = ("_cond", "_waiters", "error", "mem", "name")

    def __init__(self, value: int = 0, name: str | None = None) -> None:
        self.mem = (ctypes.c_uint64 * 2)(value, 0)  # [value, timestamp]: the memory word commands write
        self.name = name if name is not None else f"signal{next(_ids)}"
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0
        self.error: BaseException | None = None  # set when the command that would have signalled failed

    @property
    def value(self) -> int:
        return int(self.mem[0])

    @property
    def timestamp(self) -> int:
        """perf_counter_ns() at the last timestamp command (or set with stamp=True); 0 if never written."""
        return int(self.mem[1])

    def set(self, value: int, stamp: bool = False) -> None:
        """Write `value` (>= the current value: timelines never go back) and wake waiters."""
        if value < self.mem[0]:
            raise HCQValueError(f"signal {self.name!r} is a timeline: cannot go back from {self.mem[0]} to {value}")
        if stamp:
            self.mem[1] = time.perf_counter_ns()
        self.mem[0] = value
        if self._waiters:
            with self._cond:
                self._cond.notify_all()

    def stamp(self) -> None:
        """Record the current monotonic time (perf_counter_ns) in the signal's timestamp word."""
        self.mem[1] = time.perf_counter_ns()

    def fail(self, error: BaseException) -> None:
        """Mark the signal as never coming because the command that would set it failed; waiters raise `error`."""
        self.error = error
        with self._cond:
            self._cond.notify_all()

    def wait(self, value: int, timeout: float | None = None) -> None:
        """Block until the signal reaches `value`. Raises SignalTimeoutError after `timeout` seconds (default
        `default_timeout()`), or HCQError if the command that would set it failed."""
        if self.mem[0] >= value:
            return
        limit = default_timeout() if timeout is None else timeout
        forever = limit == float("inf")  # engines waiting on behalf of a queue never give up on their own
        deadline = time.monotonic() + (0.0 if forever else limit)
        with self._cond:
            self._waiters += 1
            try:
                while self.mem[0] < value:
                    if self.error is not None:
                        raise HCQError(
                            f"signal {self.name!r} will not reach {value} (it is at {self.mem[0]}): the command that "
                            f"would set it failed: {self.error}"
                        ) from self.error
                    if forever:
                        self._cond.wait()
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SignalTimeoutError(self.name, value, int(self.mem[0]), limit)
                    self._cond.wait(left)
            finally:
                self._waiters -= 1

    def __repr__(self) -> str:
        return f"<Signal {self.name} value={self.value}>"
