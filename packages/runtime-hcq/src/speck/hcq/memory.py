"""Raw memory from the OS: page-aligned host memory (Python mmap objects, so memoryviews and numpy arrays keep it
alive) and executable memory for loaded code (libc mmap/mprotect through ctypes: written read-write, then
switched to read-execute; a mapping is never writable and executable at once)."""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

from speck.hcq.errors import HostMappingError
from speck.uop.helpers import round_up

PAGE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20
PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS, MAP_32BIT = 0x02, 0x20, 0x40
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


class HostMemory:
    """`nbytes` of zero-filled, page-aligned, read-write anonymous memory. `addr` is its address; `mv` a memoryview
    over it (views and numpy arrays made from it keep the mapping alive, so freeing never leaves them dangling)."""

    __slots__ = ("_anchor", "addr", "mm", "mv", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.mm = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
            # big buffers on transparent huge pages: far fewer TLB misses when a kernel streams through them
            # (numpy does the same for its large arrays); THP in "madvise" mode needs the hint. Its price is the
            # first touch where the kernel must compact memory for a huge page (THP defrag "madvise"): on a busy
            # 2-core VM, 200 MB took 1.6-1.8 s to first write with the hint and 0.28 s without (both 0.08 s after),
            # and the cold CNN step's kernels 0.55 s CPU against 0.21 s; the warm step was ~5% faster with it
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        self._anchor = ctypes.c_char.from_buffer(self.mm)  # an export pinning the mapping for the address
        self.addr: int = ctypes.addressof(self._anchor)
        self.mv = memoryview(self.mm)[:nbytes]


class ExternalMemory:
    """Host memory speck does not own (Tensor.from_blob): `addr` and a memoryview `mv` over `nbytes` at it. A Buffer
    adopting it (Buffer.allocate(opaque)) never frees it, caches it or counts it as used: its owner keeps it alive."""

    __slots__ = ("addr", "mv", "nbytes")
    external = True

    def __init__(self, addr: int, nbytes: int) -> None:
        self.addr, self.nbytes = addr, nbytes
        self.mv = memoryview((ctypes.c_uint8 * max(nbytes, 1)).from_address(addr)).cast("B")[:nbytes]


def _mmap_raw(size: int, low: bool) -> int:
    flags = MAP_PRIVATE | MAP_ANONYMOUS | (MAP_32BIT if low else 0)
    addr = _libc.mmap(None, size, PROT_READ | PROT_WRITE, flags, -1, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise HostMappingError(err, f"mmap of {size} bytes{' below 2 GiB' if low else ''} failed: {os.strerror(err)}")
    return int(addr)


def mprotect(addr: int, size: int, prot: int) -> None:
    """Change the protection of whole pages [addr, addr+size); raises OSError naming the range on failure."""
    if size == 0:
        return
    if _libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise HostMappingError(err, f"mprotect({addr:#x}, {size}, {prot}) failed: {os.strerror(err)}")


def _unmap(addr: int, size: int) -> None:
    _libc.munmap(addr, size)
    CodeMemory.live -= 1


class CodeMemory:
    """A private anonymous mapping for one loaded object: starts read-write so the loader can copy sections and apply
    relocations, then `seal()` gives each page range its final protection (code R-X, constants R--, data RW-).
    `low=True` places it in the first 2 GiB (MAP_32BIT) for objects with absolute 32-bit relocations. `live`
    counts the mappings not unmapped yet."""

    live = 0

    def __init__(self, size: int, low: bool = False) -> None:
        self.size = round_up(max(size, 1), PAGE)
        self.addr = _mmap_raw(self.size, low)
        self.sealed = False
        CodeMemory.live += 1
        self._finalizer = weakref.finalize(self, _unmap, self.addr, self.size)

    def write(self, offset: int, data: bytes) -> None:
        """Copy `data` into the mapping at `offset` (only before sealing)."""
        assert not self.sealed and 0 <= offset and offset + len(data) <= self.size
        ctypes.memmove(self.addr + offset, data, len(data))

    def seal(self, ranges: list[tuple[int, int, int]]) -> None:
        """Apply final protections: `ranges` is a list of (page-aligned offset, size, prot); each is checked never to
        be writable and executable at once."""
        for off, size, prot in ranges:
            assert not (prot & PROT_WRITE and prot & PROT_EXEC), "W+X mapping requested"
            mprotect(self.addr + off, round_up(size, PAGE), prot)
        self.sealed = True

    def free(self) -> None:
        """Unmap now (the finalizer otherwise does it when the object is collected)."""
        self._finalizer()
