"""tinygrad.engine.memory: `memory_planner`, and `plan_memory`, which speck's multi-target realize runs on each
schedule it makes.

plan_memory places a schedule's intermediate buffers (made by this schedule, used by no one after it) in one
arena per device, at offsets chosen so that buffers whose uses overlap in the schedule never share bytes: memory is
reused within the schedule instead of each intermediate getting its own allocation. Why: fresh memory costs its
first touch (page faults, zeroing; on a VM whose RAM the host backs lazily, ~2-3 ms per MB): the main job's first
(cold) CNN training step made 492 MB of fresh allocations, all alive at once, and its Winograd kernels ran 10-60x
slower than on reused memory."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from weakref import ref

from speck.hcq import Device
from speck.tensor.schedule import (
    ScheduleItem,
    base_buffer,
    buffer_device,
    buffer_map_data,
    buffer_views,
    new_buffer_uop,
)
from speck.uop import Ops, UOp, dtypes

# buffers smaller than this keep an allocation of their own (the allocator's cache serves those cheaply)
PLAN_MIN_BYTES = 1 << 16
# offsets in an arena are multiples of this (a page: every buffer is as aligned as a fresh allocation's start
# for the kernels' vector loads)
ALIGN = 4096


def memory_planner(schedule: list[ScheduleItem]) -> list[ScheduleItem]:
    """tinygrad's hook: the schedule with buffers reassigned for reuse. A schedule alone does not say which of its
    buffers are used after it, so this returns `schedule` unchanged; speck plans in `plan_memory`, which is told."""
    return schedule


class _Arena:
    """Offsets in a growing block: best-fit from freed ranges (merged with their neighbours), else at the end."""

    def __init__(self) -> None:
        self.size = 0
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset

    def take(self, nbytes: int) -> int:
        need = -(-nbytes // ALIGN) * ALIGN
        fits = [(size, off) for off, size in self.free if size >= need]
        if fits:
            size, off = min(fits)
            k = self.free.index((off, size))
            if size == need:
                del self.free[k]
            else:
                self.free[k] = (off + need, size - need)
            return off
        if self.free and sum(self.free[-1]) == self.size:  # the last free range ends the arena: grow from it
            off, _ = self.free.pop()
        else:
            off = self.size
        self.size = off + need
        return off

    def give(self, off: int, nbytes: int) -> None:
        size = -(-nbytes // ALIGN) * ALIGN
        k = bisect.bisect(self.free, (off, size))
        if k < len(self.free) and off + size == self.free[k][0]:  # merge with the next range
            size += self.free.pop(k)[1]
        if k > 0 and sum(self.free[k - 1]) == off:  # and with the previous one
            off, prev = self.free[k - 1]
            size += prev
            k -= 1
            del self.free[k]
        self.free.insert(k, (off, size))


def plan_memory(items: Sequence[ScheduleItem], kept: Iterable[UOp], first_unique: int) -> int:
    """Give the intermediate buffers of `items` places in shared arenas (one BUFFER per device, registered in
    buffer_views, so get_buffer makes each a view of its arena's memory). An intermediate is a BUFFER this schedule
    made (its UNIQUE number is at least `first_unique`), not yet holding memory, of a fixed size of at least
    PLAN_MIN_BYTES, not a region of another buffer nor the base of one, on a device that is not file-backed, and not
    under any view in `kept` (what the caller hands out: the targets' views, and `.contiguous()` results later
    realizes read). Two buffers share bytes only when the last item using one comes strictly before the first
    item using the other. Returns the bytes planned (0: nothing to plan)."""
    keep = {b for v in kept if (b := base_buffer(v)) is not None}
    first: dict[UOp, int] = {}
    last: dict[UOp, int] = {}
    for i, it in enumerate(items):
        for b in it.bufs:
            if (region := buffer_views.get(b)) is not None:
                keep.add(b)
                keep.add(region[0])  # (its base's lifetime is not what the items show)
            first.setdefault(b, i)
            last[b] = i
    cands = [b for b in first if b not in keep and _plannable(b, first_unique)]
    if not cands:
        return 0
    arenas: dict[str, _Arena] = {}
    placed: dict[UOp, tuple[str, int]] = {}
    ends: dict[int, list[UOp]] = {}
    for b in cands:
        ends.setdefault(last[b], []).append(b)
    starts: dict[int, list[UOp]] = {}
    for b in cands:
        starts.setdefault(first[b], []).append(b)
    for i in range(len(items)):
        for b in starts.get(i, ()):
            dev = buffer_device(b)
            arena = arenas.setdefault(dev, _Arena())
            placed[b] = (dev, arena.take(_nbytes(b)))
        for b in ends.get(i, ()):  # (after item i's new buffers are placed: a kernel's output never aliases its input)
            dev, off = placed[b]
            arenas[dev].give(off, _nbytes(b))
    bases = {dev: new_buffer_uop(dev, arena.size, dtypes.uint8) for dev, arena in arenas.items()}
    for b, (dev, off) in placed.items():
        buffer_views[b] = (bases[dev], off)
    return sum(_nbytes(b) for b in placed)


def _nbytes(b: UOp) -> int:
    return int(b.arg) * b.dtype.itemsize


def _plannable(b: UOp, first_unique: int) -> bool:
    if type(b.arg) is not int or b.src[0].op is not Ops.UNIQUE or b.src[0].arg < first_unique:
        return False
    if ref(b) in buffer_map_data:
        return False
    return _nbytes(b) >= PLAN_MIN_BYTES and not Device[buffer_device(b)].file_backed


__all__ = ["memory_planner", "plan_memory"]
