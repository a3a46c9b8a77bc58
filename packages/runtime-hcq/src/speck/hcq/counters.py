"""GlobalCounters: what has run since the last reset (kernels, device copies, estimated ops and bytes, kernel time)
and the memory live buffers hold, in total and per device. The runner (speck.hcq.runner) is the one writer of the
run counters; reset() clears them."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from speck.hcq.allocator import MEMORY
from speck.hcq.registry import Device

T = TypeVar("T")


class _MemUsed:
    """Class-level properties reading the allocators' accounting at access time."""

    def __init__(self, per_device: bool) -> None:
        self.per_device = per_device

    def __get__(self, obj: Any, owner: Any) -> Any:
        if not self.per_device:
            return MEMORY.used
        opened = {id(d): d for d in Device._open.values()}  # (the registry keeps a device under every alias)
        return {d.name: d.mem_used for d in opened.values() if d.counts_memory}


class _Counts:
    """The run counters' storage: plain slots, so the runner's updates cost what an attribute store costs (a class
    attribute store would invalidate the type's attribute caches every time)."""

    __slots__ = ("copy_count", "global_mem", "global_ops", "kernel_count", "time_sum_s")

    def __init__(self) -> None:
        self.kernel_count = self.copy_count = self.global_ops = self.global_mem = 0
        self.time_sum_s = 0.0


COUNTS = _Counts()


class _Counter(Generic[T]):
    """A counter of COUNTS as a class attribute (on the metaclass: reads and writes of GlobalCounters.<name>)."""

    def __set_name__(self, owner: Any, name: str) -> None:
        self.name = name

    def __get__(self, cls: Any, owner: Any = None) -> T:
        return getattr(COUNTS, self.name)  # type: ignore[no-any-return]

    def __set__(self, cls: Any, value: T) -> None:
        setattr(COUNTS, self.name, value)


class _CountersMeta(type):
    """GlobalCounters.<counter> reads and writes COUNTS (tinygrad's code reads and resets them on the class)."""

    kernel_count: _Counter[int] = _Counter()
    copy_count: _Counter[int] = _Counter()
    global_ops: _Counter[int] = _Counter()
    global_mem: _Counter[int] = _Counter()
    time_sum_s: _Counter[float] = _Counter()


class GlobalCounters(metaclass=_CountersMeta):
    """Totals since the last `reset()`: `kernel_count` (programs run, device copies included), `copy_count`
    (device-to-device copies), `global_ops` (estimated operations), `global_mem` (estimated bytes moved),
    `time_sum_s` (kernel seconds, measured under DEBUG>=2 or PROFILE). `mem_used` is the bytes live buffers hold
    now (devices whose memory is not a file), `mem_used_per_device` the same by device name; reset() leaves those
    alone."""

    mem_used: Any = _MemUsed(per_device=False)
    mem_used_per_device: Any = _MemUsed(per_device=True)

    @staticmethod
    def reset() -> None:
        COUNTS.kernel_count = COUNTS.copy_count = COUNTS.global_ops = COUNTS.global_mem = 0
        COUNTS.time_sum_s = 0.0

    @classmethod
    def mem_used_bytes(cls) -> int:
        return int(cls.mem_used)
