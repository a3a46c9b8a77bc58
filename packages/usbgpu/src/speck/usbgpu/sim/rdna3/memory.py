"""The memory the shader core reads and writes: a lane-vectorized protocol and FlatMemory, its test implementation.

The emulator never touches bytes directly: every global/flat/scalar access goes through a `ShaderMemory`, so the GPU
model can put the same emulator behind its page tables. Addresses are 64-bit; a lane-vectorized access moves `size`
bytes at each of N addresses at once (one instruction of many waves). An address outside every mapping raises
ShaderMemoryFault with the address and the nearest mapping, as the hardware's page fault stops the queue.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from speck.usbgpu.errors import ShaderMemoryFault, UsbGpuValueError

_U8 = np.dtype(np.uint8)


class ShaderMemory(Protocol):
    """What the emulator needs from memory; gpumodel implements it over GPU virtual memory."""

    def gather(self, addresses: np.ndarray, size: int) -> np.ndarray:
        """`size` bytes at each of the N uint64 `addresses`, as a uint8 array of shape (N, size)."""
        ...

    def scatter(self, addresses: np.ndarray, data: np.ndarray) -> None:
        """Write row i of `data` (uint8, shape (N, size)) at addresses[i], in order (a later row wins an overlap)."""
        ...

    def read(self, address: int, size: int) -> bytes:
        """`size` bytes starting at `address` (instruction fetch, kernel descriptors, kernargs)."""
        ...

    def write(self, address: int, data: bytes) -> None:
        """Store `data` at `address`."""
        ...


@dataclass
class Region:
    """One mapping of FlatMemory: `data` (a uint8 array the caller may keep and read) lives at `address`; `words`
    views the same bytes as uint32 (the storage is padded to whole dwords) for fast aligned accesses."""

    address: int
    data: np.ndarray
    name: str
    words: np.ndarray
    _windows: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    def windows(self, size: int, stride: int) -> np.ndarray:
        """A writeable 1-D view of `size`-byte void items starting every `stride` bytes (overlapping): item i is the
        access at byte offset i * stride, so one fancy index moves every lane's bytes (no (lanes, size) index)."""
        view = self._windows.get((size, stride))
        if view is None:
            count = max((len(self.data) - size) // stride + 1, 0)
            view = np.ndarray((count,), np.dtype(f"V{size}"), buffer=self.words, strides=(stride,))
            self._windows[(size, stride)] = view
        return view

    @property
    def end(self) -> int:
        return self.address + len(self.data)

    def __str__(self) -> str:
        return f"{self.name or 'region'} [{self.address:#x}, {self.end:#x})"


class FlatMemory:
    """A sparse 64-bit address space of byte arrays with unmapped gaps between them (so an overrun faults).

    `alloc` places each new mapping `guard` bytes past the previous one; `map` puts one at a chosen address."""

    def __init__(self, base: int = 0x1_0000_0000, guard: int = 0x10000) -> None:
        self.regions: list[Region] = []
        self._starts: list[int] = []
        self._bounds = (np.zeros(0, np.uint64), np.zeros(0, np.uint64))  # starts and ends, for vector lookups
        self._last: Region | None = None
        self._next = base
        self.guard = guard

    def map(self, address: int, data: bytes | bytearray | np.ndarray | int, name: str = "") -> np.ndarray:
        """Map `data` (bytes, an array viewed as bytes, or a size for zeros) at `address`; returns its byte array."""
        arr = _as_bytes(data)
        if address < 0 or address + len(arr) > 1 << 64 or len(arr) == 0:
            raise UsbGpuValueError(
                f"cannot map {len(arr)} bytes at {address:#x}: need a non-empty range inside 64 bits"
            )
        i = bisect.bisect_right(self._starts, address)
        for r in self.regions[max(0, i - 1) : i + 1]:
            if address < r.end and r.address < address + len(arr):
                raise UsbGpuValueError(f"mapping {name or 'region'} at {address:#x} overlaps {r}")
        store = np.zeros(-(-len(arr) // 4) * 4, dtype=np.uint8)
        store[: len(arr)] = arr
        arr = store[: len(arr)]
        self.regions.insert(i, Region(address, arr, name, store.view(np.uint32)))
        self._starts.insert(i, address)
        self._bounds = (
            np.array(self._starts, dtype=np.uint64),
            np.array([r.end for r in self.regions], dtype=np.uint64),
        )
        self._next = max(self._next, address + len(arr) + self.guard)
        return arr

    def alloc(self, data: bytes | bytearray | np.ndarray | int, name: str = "", align: int = 256) -> int:
        """Map `data` at the next free aligned address past a guard gap; returns the address."""
        address = -(-self._next // align) * align
        self.map(address, data, name)
        return address

    def region(self, address: int) -> Region:
        """The mapping that holds `address` (ShaderMemoryFault when none does)."""
        return self._regions_for(np.array([address], dtype=np.uint64), 1, "read")[0][0]

    def array(self, address: int, dtype: np.typing.DTypeLike = np.uint8, count: int = -1) -> np.ndarray:
        """A typed view of the mapping that starts at `address` (for reading a kernel's output)."""
        r = self.region(address)
        return r.data[address - r.address :].view(dtype)[: None if count < 0 else count]

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.gather(np.array([address], dtype=np.uint64), size)[0])

    def write(self, address: int, data: bytes) -> None:
        self.scatter(np.array([address], dtype=np.uint64), np.frombuffer(bytes(data), dtype=np.uint8)[None, :])

    def gather(self, addresses: np.ndarray, size: int) -> np.ndarray:
        parts = self._split(addresses, size, "read")
        if len(parts) == 1:  # one buffer: its rows are the answer
            region, _, offsets = parts[0]
            return _rows(region, offsets, size)
        out = np.empty((len(addresses), size), dtype=np.uint8)
        for region, sel, offsets in parts:
            out[sel] = _rows(region, offsets, size)
        return out

    def scatter(self, addresses: np.ndarray, data: np.ndarray) -> None:
        size = data.shape[1]
        for region, sel, offsets in self._split(addresses, size, "write"):
            rows = np.ascontiguousarray(data[sel]).view(f"V{size}").reshape(-1)
            if size % 4 == 0 and _dword_aligned(offsets):  # dword-aligned: the windows at a 4-byte stride
                region.windows(size, 4)[offsets >> 2] = rows
            else:
                region.windows(size, 1)[offsets] = rows

    def _split(
        self, addresses: np.ndarray, size: int, kind: str
    ) -> list[tuple[Region, slice | np.ndarray, np.ndarray]]:
        addresses = np.asarray(addresses, dtype=np.uint64)
        regions, index = self._regions_for(addresses, size, kind)
        if len(regions) == 1:
            r = regions[0]
            return [(r, slice(None), (addresses - np.uint64(r.address)).view(np.int64))]  # (in range: < 2**63)
        out: list[tuple[Region, slice | np.ndarray, np.ndarray]] = []
        for k, r in enumerate(regions):
            sel = np.nonzero(index == k)[0]
            out.append((r, sel, (addresses[sel] - np.uint64(r.address)).astype(np.int64)))
        return out

    def _regions_for(self, addresses: np.ndarray, size: int, kind: str) -> tuple[list[Region], np.ndarray]:
        """The regions the accesses fall in and, per access, the index into that list; faults on any miss."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        if len(addresses):  # the common case, one instruction touching one buffer: two scalar lookups
            lo, hi = int(addresses.min()), int(addresses.max())
            last = self._last
            if last is None or lo < last.address or hi + size > last.end:
                i = bisect.bisect_right(self._starts, lo) - 1
                last = self.regions[i] if i >= 0 else None
            if last is not None and lo >= last.address and hi + size <= last.end:
                self._last = last
                return [last], np.zeros(len(addresses), dtype=np.int64)
        return self._lookup(addresses, size, kind)

    def _lookup(self, addresses: np.ndarray, size: int, kind: str) -> tuple[list[Region], np.ndarray]:
        starts, ends = self._bounds
        idx = np.searchsorted(starts, addresses, side="right").astype(np.int64) - 1
        ok = idx >= 0
        ok[ok] &= addresses[ok] + np.uint64(size) <= ends[idx[ok]]
        if not ok.all():
            bad = int(addresses[np.argmin(ok)])
            raise ShaderMemoryFault(
                f"({kind}) is outside every mapping", address=bad, size=size, space="global", region=self._near(bad)
            )
        first = idx[0] if len(idx) else 0
        if (idx == first).all():  # the common case: one instruction touches one buffer
            return [self.regions[int(first)]], np.zeros(len(idx), dtype=np.int64)
        used, inverse = np.unique(idx, return_inverse=True)
        return [self.regions[i] for i in used], inverse

    def _near(self, address: int) -> str:
        if not self.regions:
            return "nothing is mapped"
        best = min(self.regions, key=lambda r: min(abs(address - r.address), abs(address - r.end)))
        return f"nearest mapping: {best}"


def _dword_aligned(offsets: np.ndarray) -> bool:
    """Every offset a multiple of 4 (one OR-reduction pass)."""
    return not len(offsets) or not int(np.bitwise_or.reduce(offsets)) & 3


def _rows(region: Region, offsets: np.ndarray, size: int) -> np.ndarray:
    """(k, size) uint8: the bytes at each offset into `region` (bounds already checked)."""
    rows: np.ndarray
    if size % 4 == 0 and _dword_aligned(offsets):  # dword-aligned: the windows at a 4-byte stride
        rows = region.windows(size, 4)[offsets >> 2]
    else:
        rows = region.windows(size, 1)[offsets]
    return rows.view(np.uint8).reshape(-1, size)


def _as_bytes(data: bytes | bytearray | np.ndarray | int) -> np.ndarray:
    if isinstance(data, int):
        return np.zeros(data, dtype=np.uint8)
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(_U8).copy()
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()
