"""tinygrad.engine.memory: `memory_planner`, and `plan_memory`, which speck's multi-target realize runs on each
schedule it makes.

plan_memory places a schedule's intermediate buffers (made by this schedule, used by no one after it) in one
arena per device, at offsets chosen so that buffers whose uses overlap in the schedule never share bytes: memory is
reused within the schedule instead of each intermediate getting its own allocation. Why: fresh memory costs its
first touch (page faults, zeroing; on a VM whose RAM the host backs lazily, ~2-3 ms per MB): the main job's first
(cold) CNN training step made 492 MB of fresh allocations, all alive at once, and its Winograd kernels ran 10-60x
slower than on reused memory."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from weakref import ref

from speck.hcq import Device
from speck.hcq.allocator import HostAllocator
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


def place(spans: Sequence[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for blocks given as (first use, last use, bytes), and the size of the arena holding them all: two
    blocks whose use ranges meet never share a byte. Greedy by size (largest first, each at the lowest offset clear
    of the placed blocks it meets in time): within a few percent of the live peak on training steps, where a
    first-come best-fit arena left a fifth of it unused. Offsets are multiples of ALIGN."""
    order = sorted(range(len(spans)), key=lambda k: (-spans[k][2], spans[k][0]))
    offsets = [0] * len(spans)
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last) of the blocks placed so far
    size = 0
    for k in order:
        first, last, nbytes = spans[k]
        need = -(-nbytes // ALIGN) * ALIGN
        off = 0
        for o, e, _, _ in sorted(p for p in placed if p[2] <= last and first <= p[3]):  # (by offset)
            if off + need <= o:
                break  # the gap below this block fits
            off = max(off, e)
        offsets[k] = off
        placed.append((off, off + need, first, last))
        size = max(size, off + need)
    return offsets, size


def plan_memory(items: Sequence[ScheduleItem], kept: Iterable[UOp], first_unique: int) -> int:
    """Give the intermediate buffers of `items` places in shared arenas (one BUFFER per device, registered in
    buffer_views, so get_buffer makes each a view of its arena's memory). An intermediate is a BUFFER this schedule
    made (its UNIQUE number is at least `first_unique`), not yet holding memory, of a fixed size of at least
    PLAN_MIN_BYTES, not a region of another buffer nor the base of one, in host memory (HostAllocator), and not
    under any view in `kept` (what the caller hands out: the targets' views, and `.contiguous()` results later
    realizes read). Two buffers share bytes only when the last item using one comes strictly before the first
    item using the other, each device's in an arena of its own. Returns the bytes planned (0: nothing to plan).

    A schedule over several devices is planned too: its items run on several queues, not in item order, and the
    runner (speck.hcq.runner) orders what shares memory: a call waits for the copies in flight that write memory it
    uses or read memory it writes (a copy to another device still reading bytes a later kernel of its device
    reuses summed overwritten chunks in the ring allreduce before it did), and a copy between devices waits for
    both devices' earlier kernels. Unplanned, a data-parallel training step's replays touched 2.4x the memory per
    device of the one-device step's and ran its kernels a quarter slower."""
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
    by_dev: dict[str, list[UOp]] = {}
    for b in cands:
        by_dev.setdefault(buffer_device(b), []).append(b)
    for dev, bufs in by_dev.items():
        offsets, size = place([(first[b], last[b], _nbytes(b)) for b in bufs])
        base = new_buffer_uop(dev, size, dtypes.uint8)
        for b, off in zip(bufs, offsets):
            buffer_views[b] = (base, off)
    return sum(_nbytes(b) for b in cands)


def _nbytes(b: UOp) -> int:
    return int(b.arg) * b.dtype.itemsize


def _plannable(b: UOp, first_unique: int) -> bool:
    if type(b.arg) is not int or b.src[0].op is not Ops.UNIQUE or b.src[0].arg < first_unique:
        return False
    if ref(b) in buffer_map_data:
        return False
    # host memory only: that is where fresh memory costs its first touch (and views of it are plain addresses)
    return _nbytes(b) >= PLAN_MIN_BYTES and isinstance(Device[buffer_device(b)].allocator, HostAllocator)


__all__ = ["memory_planner", "plan_memory"]
