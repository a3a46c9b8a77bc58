"""GlobalCounters: what has run since the last reset (kernels, device copies, estimated ops and bytes, kernel time)
and the memory live buffers hold, in total and per device. The runner (speck.hcq.runner) is the one writer of the
run counters; reset() clears them."""

from __future__ import annotations

from typing import Any

from speck.hcq.allocator import MEMORY
from speck.hcq.registry import Device


class _MemUsed:
    """Class-level properties reading the allocators' accounting at access time."""

    def __init__(self, per_device: bool) -> None:
        self.per_device = per_device

    def __get__(self, obj: Any, owner: Any) -> Any:
        if not self.per_device:
            return MEMORY.used
        opened = {id(d): d for d in Device._open.values()}  # (the registry keeps a device under every alias)
        return {d.name: d.mem_used for d in opened.values() if d.counts_memory}


class GlobalCounters:
    """Totals since the last `reset()`: `kernel_count` (programs run, device copies included), `copy_count`
    (device-to-device copies), `global_ops` (estimated operations), `global_mem` (estimated bytes moved),
    `time_sum_s` (kernel seconds, measured under DEBUG>=2 or PROFILE). `mem_used` is the bytes live buffers hold
    now (devices whose memory is not a file), `mem_used_per_device` the same by device name; reset() leaves those
    alone."""

    kernel_count: int = 0
    copy_count: int = 0
    global_ops: int = 0
    global_mem: int = 0
    time_sum_s: float = 0.0
    mem_used: Any = _MemUsed(per_device=False)
    mem_used_per_device: Any = _MemUsed(per_device=True)

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count = GlobalCounters.copy_count = 0
        GlobalCounters.global_ops = GlobalCounters.global_mem = 0
        GlobalCounters.time_sum_s = 0.0

    @classmethod
    def mem_used_bytes(cls) -> int:
        return int(cls.mem_used)
