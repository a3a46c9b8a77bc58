"""VRAM allocator: first fit over a sorted free list, page-aligned blocks, neighbours merged on free."""

from __future__ import annotations

import bisect

from speck.usbgpu.errors import UsbGpuValueError, VramAllocError


class VramHeap:
    """Hands out aligned blocks of [start, end) and takes them back; freed space is reused."""

    def __init__(self, start: int, end: int, align: int) -> None:
        if start % align or end <= start:
            raise UsbGpuValueError(f"VRAM heap [{start:#x}, {end:#x}) must be non-empty and {align:#x}-aligned")
        self.start, self.end, self.align = start, end, align
        self._free_starts: list[int] = [start]  # sorted; parallel to _free_sizes
        self._free_sizes: list[int] = [end - start]
        self.live: dict[int, int] = {}  # va -> reserved bytes

    @property
    def free_bytes(self) -> int:
        return sum(self._free_sizes)

    def reserved(self, nbytes: int) -> int:
        """Bytes a request of `nbytes` reserves (at least one aligned unit)."""
        return -(-max(nbytes, 1) // self.align) * self.align

    def alloc(self, nbytes: int) -> int:
        """Reserve `nbytes` (rounded up to the alignment) and return the block's address."""
        size = self.reserved(nbytes)
        for i, block in enumerate(self._free_sizes):
            if block >= size:
                va = self._free_starts[i]
                if block == size:
                    del self._free_starts[i], self._free_sizes[i]
                else:
                    self._free_starts[i] += size
                    self._free_sizes[i] -= size
                self.live[va] = size
                return va
        largest = max(self._free_sizes, default=0)
        raise VramAllocError(
            f"VRAM allocation of {nbytes} bytes",
            f"no free block of {size} bytes: {self.free_bytes} bytes free in all, the largest block is {largest}",
            "free buffers you no longer need (UsbGpu.free) or allocate less",
        )

    def free(self, va: int) -> None:
        """Return the block at `va` (which must be live) and merge it with free neighbours."""
        size = self.live.pop(va)
        i = bisect.bisect_left(self._free_starts, va)
        self._free_starts.insert(i, va)
        self._free_sizes.insert(i, size)
        if i + 1 < len(self._free_starts) and va + size == self._free_starts[i + 1]:
            self._free_sizes[i] += self._free_sizes.pop(i + 1)
            del self._free_starts[i + 1]
        if i > 0 and self._free_starts[i - 1] + self._free_sizes[i - 1] == va:
            self._free_sizes[i - 1] += self._free_sizes.pop(i)
            del self._free_starts[i]

    def blocks(self) -> list[tuple[int, int]]:
        """The free list as (start, size), in address order."""
        return list(zip(self._free_starts, self._free_sizes))
