"""Allocators: device memory with an LRU cache of freed allocations and mem_used accounting.

`mem_used` counts bytes held by live buffers (per allocator, and globally in `MEMORY.used`); freed allocations
sit in the LRU cache (counted in `cached`) until reused by an allocation of the same size and options, evicted
(oldest first) when the cache outgrows its cap, or dropped to make room before an out-of-memory error. A Buffer
parked in a `SpareBuffers` list (kept by its maker to use again, held by nothing else) is not live: reading
`mem_used` and running short of memory release those first."""

from __future__ import annotations

import mmap
import operator
import os
import sys
import threading
import weakref
import zlib
from collections import OrderedDict
from typing import Any, NamedTuple

from speck.hcq.errors import CopySizeError, CorruptFileError, HCQError, HCQTypeError, HCQValueError, OutOfMemoryError
from speck.hcq.memory import ExternalMemory, HostMemory
from speck.hcq.settings import LRU


class _GlobalMemory:
    """Process-wide accounting: `used` is the sum of every live allocator's mem_used, added up when read (an
    allocation or free touches only its own allocator's books, under that allocator's lock: no process-wide lock on
    the per-op path)."""

    def __init__(self) -> None:
        self._allocators: weakref.WeakSet[Allocator] = weakref.WeakSet()

    def register(self, allocator: Allocator) -> None:
        self._allocators.add(allocator)

    @property
    def used(self) -> int:
        if _spares:
            release_spares()
        return sum(a._used for a in list(self._allocators))


MEMORY = _GlobalMemory()


class SpareBuffers(list):  # type: ignore[type-arg]
    """Buffers (or objects whose death frees Buffers: speck.tensor keeps an output's BUFFER node, whose entry names
    its Buffer) that their maker keeps from one run to the next to use again, with their memory: a warm eager plan
    keeps what a run made here, and its next run takes it back (`pop`, then `sys.getrefcount(x) == 2`: nothing else
    holds it) instead of making a Buffer and allocating, and freeing both when the result dies. One here that
    nothing else holds is parked: not live memory. `mem_used` readers and an allocation that runs short release the
    parked ones (release_spares), so the books count what is in use. `pop`/`append` are list's own (atomic under
    the GIL: two threads never take one)."""

    __slots__ = ("__weakref__",)

    def __hash__(self) -> int:  # type: ignore[override]  # (one pool: by identity, as the registry needs)
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __init__(self) -> None:
        super().__init__()
        _spares.add(self)


_spares: weakref.WeakSet[SpareBuffers] = weakref.WeakSet()


def release_spares() -> None:
    """Drop every parked spare (held by its SpareBuffers list only): its death frees its memory."""
    for spares in list(_spares):
        kept = []
        while True:
            try:
                b = spares.pop()
            except IndexError:
                break
            if sys.getrefcount(b) > 2:  # (b and getrefcount's argument: a live tensor still holds it)
                kept.append(b)
            del b  # (a parked one is freed here)
        spares.extend(kept)


class BufferOptions(NamedTuple):
    """Per-buffer allocation options. `lru=False` frees straight back to the OS instead of caching; `writable`
    (DISK only) forces a read-write mapping (True) or a read-only one (False); None lets the device decide.
    Immutable; hashed and compared as a tuple (in C: the LRU cache keys every alloc and free by (size, options))."""

    lru: bool = True
    writable: bool | None = None


DEFAULT_OPTIONS = BufferOptions()


def parse_bytes(text: str, setting: str = "") -> int:
    """'123', '64K', '512M', '2G' (binary multiples) -> bytes; an HCQValueError naming the text (and the setting it
    came from) otherwise: a negative count, or inf (int(inf) was a bare OverflowError)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        n = int(float(t[:-1] if mult > 1 else t) * mult)
    except (ValueError, OverflowError):
        n = -1
    if n < 0:
        where = f"{setting}={text!r}" if setting else repr(text)
        raise HCQValueError(f"cannot read {where} as a byte count (a whole number of bytes >= 0); use e.g. "
                            "1073741824, 512M or 2G")  # fmt: skip
    return n


def available_ram() -> int:
    """MemAvailable from /proc/meminfo (bytes); total physical memory when that is unreadable."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class Allocator:
    """Base allocator. Subclasses implement `_alloc`/`_free` and the host-access hooks; this class adds the LRU
    cache, the byte limit (`limit`, None = unlimited) and accounting."""

    def __init__(self, device: str, limit: int | None = None, cache_cap: int = 1 << 30) -> None:
        self.device, self.limit, self.cache_cap = device, limit, cache_cap
        self.limit_setting = ""  # the setting that raises `limit` (named in out-of-memory errors), if any
        self._used = 0  # bytes of live allocations (mem_used: the same after parked spares are released)
        self.cached = 0
        self.peak = 0
        # (size, options) -> freed allocations, least recently freed size first; a list may be empty (all taken)
        self._cache: OrderedDict[tuple[int, BufferOptions], list[Any]] = OrderedDict()
        self._lock = threading.Lock()
        # frees not done yet: Buffer finalizers run whenever the garbage collector does, also while this thread
        # holds _lock inside alloc(); such a free is queued here and done by the next holder of the lock
        self._pending: list[tuple[Any, int, BufferOptions]] = []
        MEMORY.register(self)

    # -- accounting + cache -------------------------------------------------------------------------------------
    @property
    def mem_used(self) -> int:
        """Bytes held by live buffers (parked spare Buffers released first: their memory is not in use)."""
        if _spares:
            release_spares()
        return self._used

    def alloc(self, nbytes: int, options: BufferOptions = DEFAULT_OPTIONS) -> Any:
        """An allocation of `nbytes` (from the LRU cache when one of that size and options is there). Raises
        OutOfMemoryError with the requested and available sizes when it cannot fit."""
        if type(nbytes) is not int or nbytes < 0:
            if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__"):
                raise HCQTypeError(f"allocating on {self.device}: the size must be an int byte count, got {nbytes!r} "
                                   f"({type(nbytes).__name__})")  # fmt: skip
            nbytes = int(nbytes.__index__())  # (a numpy int)
            if nbytes < 0:
                raise HCQValueError(f"cannot allocate a negative size ({nbytes} bytes) on {self.device}")
        key = (nbytes, options)
        lock = self._lock
        try:
            lock.acquire()  # (acquire/release, not `with`: the lock's context manager costs two method calls)
            try:
                if self._pending:
                    self._release_pending()
                if options.lru and (lst := self._cache.get(key)):  # the hot path: a freed allocation of this size
                    opaque = lst.pop()  # (an emptied list keeps its place: the next free of this size refills it)
                    self.cached -= nbytes
                    self._used += nbytes  # _account, inlined
                    if self._used > self.peak:
                        self.peak = self._used
                    return opaque
                if self.limit is not None and self._used + self.cached + nbytes > self.limit:
                    self._drop_cache()
                    if self._used + nbytes > self.limit and _spares:
                        release_spares()  # (their frees queue behind this lock: done now)
                        self._release_pending()
                        self._drop_cache()
                    if self._used + nbytes > self.limit:
                        raise OutOfMemoryError(self.device, nbytes, max(self.limit - self._used, 0),
                                               f"limit {self.limit} bytes", self.limit_setting)  # fmt: skip
            finally:
                lock.release()
            return self._alloc_new(nbytes, options)
        finally:
            if self._pending:
                self._flush_pending()  # frees a finalizer queued while this thread held the lock

    def _alloc_new(self, nbytes: int, options: BufferOptions) -> Any:
        try:
            opaque = self._alloc(nbytes, options)
        except (MemoryError, OSError) as e:
            if isinstance(e, OSError) and e.errno not in (12, None):  # only ENOMEM means "retry after freeing"
                raise HCQError(f"allocating {nbytes} bytes on {self.device} failed: {e}") from e
            release_spares()
            with self._lock:
                self._release_pending()
                self._drop_cache()
            try:
                opaque = self._alloc(nbytes, options)
            except (MemoryError, OSError) as e2:
                avail = self.limit - self._used if self.limit is not None else available_ram()
                raise OutOfMemoryError(self.device, nbytes, max(avail, 0), f"the OS refused: {e2}",
                                       self.limit_setting) from None  # fmt: skip
        with self._lock:
            self._account(nbytes)
        return opaque

    def _account(self, nbytes: int) -> None:
        self._used += nbytes
        if self._used > self.peak:
            self.peak = self._used

    def free(self, opaque: Any, nbytes: int, options: BufferOptions = DEFAULT_OPTIONS) -> None:
        """Give an allocation back: into the LRU cache when options.lru (and the LRU setting), else to the OS. Safe
        from a finalizer
        that runs while this allocator is busy (a garbage collection inside alloc on this thread, or another
        thread holding the lock): the free is queued and done by the lock's next holder, never waited for."""
        if type(opaque) is ExternalMemory:  # (someone else's memory: never freed, cached or counted)
            return
        lock = self._lock
        if options.lru and nbytes <= self.cache_cap and LRU.value and not self._pending and lock.acquire(False):
            # the hot path (_release_pending for one allocation, inlined): into the LRU cache
            try:
                self._used -= nbytes
                key = (nbytes, options)
                cache = self._cache
                if (lst := cache.get(key)) is None:
                    cache[key] = [opaque]
                else:
                    if lst and lst[-1] is opaque:  # (freed twice in a row: two allocs would share the memory)
                        self._used += nbytes
                        raise self._double_free(nbytes)
                    lst.append(opaque)
                    cache.move_to_end(key)
                self.cached += nbytes
                if self.cached > self.cache_cap:
                    self._evict()
            finally:
                lock.release()
            if self._pending:  # queued by a finalizer meanwhile
                self._flush_pending()
            return
        self._pending.append((opaque, nbytes, options))
        if lock.acquire(blocking=False):
            try:
                self._release_pending()
            finally:
                lock.release()
            if self._pending:  # queued by a finalizer meanwhile
                self._flush_pending()

    def _double_free(self, nbytes: int) -> HCQValueError:
        return HCQValueError(f"{self.device}: an allocation of {nbytes} bytes was freed twice (it is already in the "
                             "free cache, and two later allocations would share its memory); free each allocation "
                             "once")  # fmt: skip

    def _flush_pending(self) -> None:
        while self._pending and self._lock.acquire(blocking=False):
            try:
                self._release_pending()
            finally:
                self._lock.release()

    def _release_pending(self) -> None:
        """Do the queued frees (the caller holds _lock)."""
        pending, cache = self._pending, self._cache
        while pending:
            opaque, nbytes, options = pending.pop()
            self._used -= nbytes
            if not (options.lru and nbytes <= self.cache_cap and LRU.value):
                self._free(opaque, nbytes, options)
                continue
            key = (nbytes, options)
            lst = cache.get(key)
            if lst is None:
                cache[key] = [opaque]  # a new key goes in at the most recent end
            else:
                lst.append(opaque)
                cache.move_to_end(key)
            self.cached += nbytes
            self._evict()

    def _evict(self) -> None:
        """Free the least recently freed cached allocations until the cache fits its cap (the caller holds _lock)."""
        cache = self._cache
        while self.cached > self.cache_cap and cache:
            (sz, opts), lst = next(iter(cache.items()))
            if lst:
                self._free(lst.pop(0), sz, opts)
                self.cached -= sz
            if not lst:
                del cache[(sz, opts)]

    def _drop_cache(self) -> None:
        for (sz, opts), lst in self._cache.items():
            for opaque in lst:
                self._free(opaque, sz, opts)
        self._cache.clear()
        self.cached = 0

    def free_cache(self) -> None:
        """Release every cached (freed but kept) allocation to the OS."""
        with self._lock:
            self._release_pending()
            self._drop_cache()

    # -- per-device hooks ---------------------------------------------------------------------------------------
    def _alloc(self, nbytes: int, options: BufferOptions) -> Any:
        raise NotImplementedError

    def _free(self, opaque: Any, nbytes: int, options: BufferOptions) -> None:
        pass  # most allocations are released when their last reference goes

    def address(self, opaque: Any) -> int:
        """The device address of an allocation (what kernels receive)."""
        raise HCQError(f"{self.device} memory has no address kernels can use")

    def as_memoryview(self, opaque: Any, offset: int, nbytes: int) -> memoryview:
        """A zero-copy byte view of [offset, offset+nbytes) of the allocation, when the host can see it."""
        raise HCQError(f"{self.device} memory is not visible from the host; use copyout instead")

    def copyin(self, opaque: Any, offset: int, src: memoryview) -> None:
        """Copy host bytes into the allocation at `offset`."""
        view = self.as_memoryview(opaque, offset, src.nbytes)
        try:
            view[:] = src
        except (ValueError, TypeError):
            raise self._copy_error("copyin", "into", opaque, offset, src) from None

    def copyout(self, dest: memoryview, opaque: Any, offset: int) -> None:
        """Copy the allocation's bytes at `offset` into host memory `dest`."""
        view = self.as_memoryview(opaque, offset, dest.nbytes)
        try:
            dest[:] = view
        except (ValueError, TypeError):
            raise self._copy_error("copyout", "from", opaque, offset, dest) from None

    def _copy_error(self, what: str, way: str, opaque: Any, offset: int, host: Any) -> HCQError:
        """Why a raw copy failed (it only fails on misuse: the sizes the Buffer-level copies check)."""
        size = getattr(opaque, "nbytes", None)
        if not isinstance(offset, int) or offset < 0:
            return HCQValueError(f"{self.device} allocator.{what}: offset must be a byte offset >= 0, got {offset!r}")
        n = getattr(host, "nbytes", None)
        if n is not None and size is not None and offset + n > size:
            return CopySizeError(f"{self.device} allocator.{what}: {n} bytes at offset {offset} don't fit the "
                                 f"{size}-byte allocation; copy at most {max(size - offset, 0)} bytes {way} there "
                                 "(Buffer.copyin/copyout check this for you)")  # fmt: skip
        return HCQValueError(f"{self.device} allocator.{what}: the host memory must be a C-contiguous byte view "
                             f"(memoryview(...).cast('B')), got {host!r}")  # fmt: skip


class HostAllocator(Allocator):
    """Page-aligned anonymous host memory (mmap), directly addressable by CPU kernels and viewable by numpy."""

    def _alloc(self, nbytes: int, options: BufferOptions) -> HostMemory:
        return HostMemory(nbytes)

    # (a C callable, not a method: Buffer.ptr calls it for every fresh buffer, so no Python frame)
    address = staticmethod(operator.attrgetter("addr"))  # type: ignore[assignment]

    def as_memoryview(self, opaque: HostMemory, offset: int, nbytes: int) -> memoryview:
        if offset < 0:  # (a negative start would slice from the end: the wrong bytes, silently)
            raise HCQValueError(f"{self.device}: a byte offset into an allocation must be >= 0, got {offset}")
        return opaque.mv[offset : offset + nbytes]


class NullMemory:
    """A stand-in allocation of the NULL device: it has a size and nothing else."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class NullAllocator(Allocator):
    """Accepts every allocation and stores nothing; copies in and out do nothing (for counting and scheduling
    tests)."""

    def _alloc(self, nbytes: int, options: BufferOptions) -> NullMemory:
        return NullMemory(nbytes)

    def address(self, opaque: NullMemory) -> int:
        return 0

    def copyin(self, opaque: Any, offset: int, src: memoryview) -> None:
        pass

    def copyout(self, dest: memoryview, opaque: Any, offset: int) -> None:
        pass


class DiskMapping:
    """A file mapped into memory: `mv` is read-only when the mapping is; `ident` is (st_dev, st_ino) of the file
    mapped, so a reader by path can tell that the path now names another file. `checks`: ranges of the file with the
    CRC-32 its container records for them (DiskAllocator.expect_crc32), verified when that range is read."""

    __slots__ = ("checks", "ident", "mm", "mv", "nbytes", "path", "writable")

    def __init__(self, path: str, nbytes: int, writable: bool | None) -> None:
        exists = os.path.exists(path)
        size = os.path.getsize(path) if exists else 0
        if writable is None:
            # an existing file big enough is opened for reading (weights); otherwise it is created/extended
            writable = not (exists and size >= nbytes)
        if not writable and size < nbytes:
            raise HCQError(f"DISK:{path} is {size} bytes, smaller than the {nbytes} bytes requested for reading: the "
                           "file shrank since the tensor was made (load it again) or the shape asks for more bytes "
                           "than it holds")  # fmt: skip
        self.path, self.nbytes = path, nbytes
        self.checks: dict[tuple[int, int], tuple[int, str]] = {}  # (offset, nbytes) -> (crc32, what) to verify
        self._map(open(path, "r+b" if exists and writable else "w+b" if writable else "rb"), size, writable)

    def _map(self, file: Any, size: int, writable: bool) -> None:
        # the mapping holds its own handle on the file: the file object is closed here (left open, it would stay
        # open until garbage collection, which warns "unclosed file" - in the user's test output)
        with file:
            self.writable = writable
            st = os.fstat(file.fileno())
            self.ident = (st.st_dev, st.st_ino)  # the file mapped (the path may name another one later)
            if writable and size < self.nbytes:
                file.truncate(self.nbytes)
            if self.nbytes == 0:
                self.mm = None
                self.mv = memoryview(b"") if not writable else memoryview(bytearray())
                return
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self.mm = mmap.mmap(file.fileno(), self.nbytes, access=access)
            self.mv = memoryview(self.mm)

    def make_writable(self) -> None:
        """Map the file read-write from now on (extending it to the mapping's size if it is shorter): for a caller
        that mapped it for reading and is about to write it. Views taken before keep showing the same file pages
        (both mappings are shared), read-only."""
        if not self.writable:  # (the old mapping, still referenced by views, keeps its own handle on the file)
            self._map(open(self.path, "r+b"), os.path.getsize(self.path), True)


class DiskAllocator(Allocator):
    """Memory-maps the device's file: each buffer maps the first nbytes of it (views select regions). Not cached."""

    def __init__(self, device: str, path: str) -> None:
        super().__init__(device, limit=None, cache_cap=0)
        self.path = path

    def _alloc(self, nbytes: int, options: BufferOptions) -> DiskMapping:
        try:
            return DiskMapping(self.path, nbytes, options.writable)
        except (OSError, ValueError, OverflowError) as e:  # (mmap's ValueError: a file that can't grow, like /proc's)
            raise HCQError(f"cannot map {self.device} ({nbytes} bytes): {type(e).__name__}: {e}") from None

    def _check_size(self, opaque: DiskMapping, offset: int, nbytes: int) -> None:
        """The file still holds [offset, offset + nbytes): another program may have truncated it since it was
        mapped, and touching a mapped page past its end kills the process with SIGBUS (one fstat, of the mapping's
        own handle: the file it maps, even if the path now names another)."""
        if opaque.mm is None or nbytes <= 0:
            return
        try:
            size = opaque.mm.size()
        except (OSError, ValueError) as e:
            raise HCQError(f"{self.device}: can't check the mapped file's size: {type(e).__name__}: {e}") from e
        if size < offset + nbytes:
            raise HCQError(
                f"{self.device} shrank to {size} bytes since it was mapped ({opaque.nbytes} bytes); bytes "
                f"[{offset}, {offset + nbytes}) are gone. Another program truncated or rewrote the file: load it again"
            )

    def as_memoryview(self, opaque: DiskMapping, offset: int, nbytes: int) -> memoryview:
        self._check_size(opaque, offset, nbytes)
        if opaque.checks:
            self.verify(opaque, offset, nbytes)
        return opaque.mv[offset : offset + nbytes]

    def expect_crc32(self, opaque: DiskMapping, offset: int, nbytes: int, crc: int, what: str) -> None:
        """The file's bytes [offset, offset + nbytes) must have CRC-32 `crc` (what its container recorded, e.g. a
        zip member's): each read of exactly that range checks them until one matched. Reads of other ranges (a part
        of it, the whole file) are not checked: a damaged member must not make the rest of the file unreadable."""
        opaque.checks[(offset, nbytes)] = (crc & 0xFFFFFFFF, what)

    def verify(self, opaque: DiskMapping, offset: int, nbytes: int) -> None:
        """CorruptFileError when [offset, offset + nbytes) is a range with an expected CRC-32 that its bytes don't
        have; a range that matched once is not checked again."""
        if (want := opaque.checks.get((offset, nbytes))) is None:
            return
        crc, what = want
        if (found := zlib.crc32(opaque.mv[offset : offset + nbytes])) != crc:
            raise CorruptFileError(
                f"{self.device}: bytes [{offset}, {offset + nbytes}) ({what}) have CRC-32 {found:#010x}, but the file "
                f"records {crc:#010x} for them: the file was damaged after it was written (a broken download or copy, "
                "a bad disk). Fetch or copy it again"
            )
        opaque.checks.pop((offset, nbytes), None)  # (another thread may have verified it too)

    def copyin(self, opaque: DiskMapping, offset: int, src: memoryview) -> None:
        if not opaque.writable:
            raise HCQError(
                f"{self.device} is mapped read-only (the file existed and was large enough); create the buffer with "
                "options=BufferOptions(writable=True) to write it"
            )
        self._check_size(opaque, offset, src.nbytes)
        opaque.mv[offset : offset + src.nbytes] = src


def check_copy_size(what: str, expected: int, got: int) -> None:
    """Raise CopySizeError when a copy's two sides differ in size."""
    if expected != got:
        raise CopySizeError(f"{what}: the buffer holds {expected} bytes but the other side has {got} bytes")
