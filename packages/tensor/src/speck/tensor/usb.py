"""The USB device: tensors stored in the VRAM of an AMD GPU behind a USB bridge, through speck.usbgpu.

`USB` (and `USB:<n>` for the n-th bridge) is speck.hcq's AMD device (speck.hcq.amd) over a `UsbLink`: buffers in
VRAM (`UsbGpu.alloc/free`), kernels from the AMD backend (gfx1100) uploaded once and dispatched with the driver's
PM4 compute queue (a TinyJit replay is one indirect buffer and one doorbell), a copy queue that moves data with the
driver's G3 copy-in and its copy-out, and timeline signals ordering those copies against other devices' work and
host reads. `USB:SIM` is the first simulated bridge (under `SPECK_USB_SIM=<n>` the bus those n bridges are on, so
there `USB:SIM` is `USB`), whose GPU runs the kernels in the RDNA3 emulator. On hardware, opening the device runs the
driver's bring-up, which refuses the steps not verified on a real card unless SPECK_USBGPU_UNVERIFIED=1
(`GpuBringUpUnverified`).

Copies from a file (safe_load to USB, DISK tensors moved to USB) stream: the file is read with pread into two
pinned staging buffers, and while one is copied into VRAM (G3, asynchronously) the next chunk is read into the
other; the file is never held in host memory. A DISK tensor whose file was mapped reads that file: when its path names
another file by then (a save over it after a lazy load), the copy reads through the mapping instead.

A kernel fault or hang is raised once and the compute queue restarts by itself; the buffers the dropped kernels were
to write are marked undefined (reading them raises BufferStateError) until rewritten (_DroppedWork).

Ctrl-C (or any failure that leaves the driver session in an unknown state, such as a KeyboardInterrupt caught in the
middle of a dispatch or copy) makes every later use of the device raise DeviceUnavailableError saying so;
`Device["USB:SIM"].reopen()` opens the bridge again on a new session. Tensors stored on it before lose their data:
using them raises DeviceUnavailableError (never old or foreign bytes); compute or load them again.

speck.hcq knows nothing of this module: it is registered with `speck.hcq.registry.register_device` when speck.tensor
is imported and through the `speck.devices` entry point, and only when speck-usbgpu is installed."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from speck.hcq.allocator import DEFAULT_OPTIONS, BufferOptions, DiskAllocator, check_copy_size
from speck.hcq.amd import AMDDevice, AmdKernel, AMDProgram, LinkAllocator
from speck.hcq.buffer import Buffer
from speck.hcq.errors import BufferStateError, DeviceUnavailableError, HCQError
from speck.hcq.interfaces import DeviceLike
from speck.hcq.memory import HostMemory
from speck.hcq.registry import numbered, register_device
from speck.tensor import bounds
from speck.tensor import random as _random
from speck.tensor import realize as _realize
from speck.tensor.schedule import buffer_map_data, realized_cache
from speck.tensor.settings import USB_KERNEL_TIMEOUT

if TYPE_CHECKING:
    from speck.usbgpu.amd.compute import KernelCode
    from speck.usbgpu.api import CopyHandle, UsbGpu, VramBuffer

# One G3 copy-in per staging chunk: each copy-in costs about 0.7 ms of fixed link time (ring build, doorbell, first
# arms, last flag), so chunks of 16 MiB keep a streamed load within ~2% of one copy-in of the same bytes (8 MiB: 6%).
STAGING_CHUNK = 16 << 20
SIM_SUFFIX = "SIM"


@dataclass(frozen=True)
class LostBuffer:
    """What a buffer of a device's earlier session holds after the device was reopened: its VRAM is gone."""

    device: str
    nbytes: int


@dataclass(frozen=True)
class FileRange:
    """The source of a streamed copy: the bytes of the file at `path` from `offset` on. `ident`: (st_dev, st_ino) of
    the file meant (a DISK tensor's mapping), when the path may have been replaced since."""

    path: str
    offset: int
    ident: tuple[int, int] | None = None


def _file_ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class UsbLink:
    """speck.hcq.amd's AmdLink over a speck.usbgpu session: VRAM and copies through the bridge (G3 copy-in,
    copy-out), code images uploaded once, dispatches as the driver's PM4 (KernelCode from the hcq kernel's
    descriptor fields), batches as one INDIRECT_BUFFER and one doorbell, waits on the compute timeline."""

    def __init__(self, gpu: UsbGpu, name: str) -> None:
        self.gpu, self.name = gpu, name
        self._codes: dict[AmdKernel, KernelCode] = {}
        self.submitted = self.done = 0  # compute timeline: the last value submitted, the last one seen reached
        self._guard = _SessionGuard(self)
        self.dropped = _DroppedWork()

    def reconnect(self, gpu: UsbGpu) -> None:
        """Use a new session (UsbDevice.reopen): handles of the old one are disowned (owns() is False)."""
        self.gpu = gpu
        self._codes.clear()
        self.submitted = self.done = 0
        self.dropped = _DroppedWork()

    def owns(self, handle: Any) -> bool:
        return getattr(handle, "owner", None) == self.gpu.session

    def _lost(self, handle: Any, verb: str) -> HCQError:
        """The error for a handle of an earlier session (a LostBuffer, or a VramBuffer the reopen did not reach)."""
        return DeviceUnavailableError(
            f"{verb} a buffer of {self.name} that was allocated before the device was reopened "
            f"(Device[{self.name!r}].reopen()): its data was lost with the old session; compute or load the "
            "tensor again (a TinyJit captured before the reopen: call its reset() first)"
        )

    def _settle(self) -> None:
        """Wait on the host for the compute work submitted so far before a copy: a copy that waited for it on the GPU
        would fail with the queue's fault, and the driver treats a failed copy as a broken session (reopen); raised
        from here, GpuFault / GpuHang leave the session usable after a queue reset."""
        if self.submitted > self.done:
            self.wait(self.submitted)

    def heap_bytes(self) -> int:
        heap = self.gpu.context.heap  # what alloc can hand out: the byte limit behind the hcq out-of-memory error
        return int(heap.end - heap.start)

    def alloc(self, nbytes: int) -> VramBuffer:
        from speck.usbgpu.errors import VramAllocError

        try:
            handle = self.gpu.alloc(nbytes)
        except VramAllocError as e:  # fragmentation: the base class drops its cache, retries, then reports
            raise MemoryError(str(e)) from e
        self.dropped.handles[handle.va] = handle
        return handle

    def free(self, handle: VramBuffer) -> None:
        from speck.usbgpu.errors import UsbError

        if not self.owns(handle):  # an earlier session's (or lost) buffer: its VRAM went with that session
            return
        self.dropped.freed(handle)
        try:
            self.gpu.free(handle)
        except (UsbError, ValueError):  # a closed or failed session: its VRAM is gone with it
            pass

    def address(self, handle: VramBuffer) -> int:
        if not self.owns(handle):
            raise self._lost(handle, "a kernel was given")
        return handle.va

    def copyin(self, handle: VramBuffer, offset: int, src: memoryview) -> None:
        if not self.owns(handle):
            raise self._lost(handle, "copying into")
        with self._guard:
            self._settle()
            self.gpu.copyin(handle, src, offset)
        if offset == 0 and len(src) >= handle.size:  # every byte of it is the host's now
            self.dropped.forget(handle)

    def copyout(self, dest: memoryview, handle: VramBuffer, offset: int) -> None:
        if not self.owns(handle):
            raise self._lost(handle, "reading")
        with self._guard:
            self._settle()
        self.dropped.check_read(handle.va + offset, self.name, "reading it back")
        with self._guard:
            self.gpu.copyout(dest, handle, offset)

    def upload(self, image: bytes) -> VramBuffer:
        with self._guard:
            self._settle()
            return self.gpu.upload(image)

    def launch_packets(self, kernel: AmdKernel, grid: Sequence[int], block: Sequence[int], kernargs: bytes) -> Any:
        code = self._codes.get(kernel)
        if code is None:
            from speck.usbgpu.amd.compute import KernelCode

            code = self._codes[kernel] = KernelCode(
                entry=kernel.entry, rsrc1=kernel.rsrc1, rsrc2=kernel.rsrc2, rsrc3=kernel.rsrc3,
                user_sgprs=kernel.user_sgprs, group_segment_size=kernel.group_segment_size,
                private_segment_size=kernel.private_segment_size, kernarg_size=kernel.kernarg_size,
                wave32=kernel.wave32, name=kernel.name, dynamic_stack=kernel.dynamic_stack,
            )  # fmt: skip
        with self._guard:
            return self.gpu.launch_packets(code, grid, block, kernargs)

    def submit(self, packets: Any, batch: bool) -> int:
        with self._guard:
            self.submitted = self.gpu.submit(packets, batch=batch)
        self.dropped.submitted(self.submitted)
        return self.submitted

    def wait(self, value: int) -> None:
        """Wait for compute timeline `value`. A fault or hang of the queue is raised once (GpuFault / GpuHang, with
        a note naming what it dropped), after the queue was restarted: the next operation runs. The buffers the
        dropped work was to write are marked undefined (_DroppedWork), so reading them raises instead of
        returning stale or foreign bytes."""
        try:
            with self._guard:
                self.gpu.wait(value, timeout=float(USB_KERNEL_TIMEOUT.value))
        except self.gpu.queue_stops as e:
            self._recover(e)
            raise
        self.done = max(self.done, value)
        self.dropped.retired(value)

    def _recover(self, err: Exception) -> None:
        """After the compute queue stopped: mark what the unfinished submissions write, restart the queue."""
        with self._guard:
            reached = self.gpu.completed()  # the last submission that ran to its end (before the reset)
            self.gpu.reset_queue()
        n = self.dropped.drop_after(reached)
        self.done = self.submitted
        if n:  # an expression realized into one of them must be computed again, not looked up
            realized_cache.clear()
        err.add_note(
            f"speck.tensor: {self.name} restarted its compute queue, so later operations run; the kernels submitted "
            f"after compute signal {reached} did not all run, and the {n} buffer(s) they write hold undefined data "
            "(reading one raises BufferStateError): compute or load those tensors again"
        )

    def completed(self) -> int:
        with self._guard:
            value = self.gpu.completed()
        self.dropped.retired(value)
        return value

    def reset_queue(self) -> None:
        try:  # a stop not yet reported is reported by its wait: that marks what it dropped, then restarts the queue
            self.wait(self.submitted)
        except self.gpu.queue_stops:
            pass
        with self._guard:
            self.gpu.reset_queue()
        self.done = self.submitted


# what a dispatch may do to a buffer argument, by the `.actual_access` the code object's metadata gives it ("" when
# LLVM could not tell): reads and writes
_READS = frozenset({"read_only", "read_write", ""})
_WRITES = frozenset({"write_only", "read_write", ""})


class _DroppedWork:
    """Which VRAM allocations hold undefined bytes after the compute queue stopped (a fault or hang drops every
    submission after the last one that completed, and the faulting kernel may have written part of its outputs).

    Every dispatch notes the buffer addresses it may write (its write-capable kernel arguments) and a key that fixes
    what it writes (kernel, argument words, grid); at a stop, the allocations those addresses fall in become
    undefined, each remembering which dropped dispatches wrote it. It is defined again when all of those dispatches
    are submitted again (a TinyJit replay, which rewrites exactly what the dropped one would have), when the host
    copies into all of it, or when it is freed (a new allocation holds no data yet). A dispatch that reads an
    undefined allocation, or a copy-out of one, raises BufferStateError: never stale or foreign bytes. Where it
    cannot tell, it keeps the mark (a needless error at worst, never a wrong value)."""

    def __init__(self) -> None:
        self.handles: dict[int, VramBuffer] = {}  # va -> live allocation (addresses to allocations, at a stop)
        self.undefined: dict[int, set[tuple[Any, ...]]] = {}  # va -> keys of the dropped dispatches writing it
        self._pending: list[tuple[tuple[Any, ...], tuple[int, ...]]] = []  # launches built, not yet submitted
        self._inflight: list[tuple[int, list[tuple[tuple[Any, ...], tuple[int, ...]]]]] = []  # (signal, launches)
        self._cleared: list[tuple[int, tuple[Any, ...]]] = []  # marks the pending launches took away
        self._lock = threading.RLock()  # (engine threads build launches; finalizers free buffers)

    def dispatch_built(
        self, key: tuple[Any, ...], reads: Sequence[int], writes: Sequence[int], name: str, kernel: str
    ) -> None:
        """A dispatch is being built: refuse it if it reads undefined bytes, note what it writes. A dispatch that
        writes what a dropped one would have (same key) makes those bytes defined again once it is submitted;
        later dispatches of the same submission already see them so."""
        with self._lock:
            if self.undefined:
                try:
                    for addr in reads:
                        self.check_read(addr, name, f"running kernel {kernel!r}, which reads it")
                except BufferStateError:
                    self._restore()  # nothing of this submission is sent: its clears never happened
                    self._pending = []
                    raise
                for addr in writes:
                    h = self._find(addr, self.undefined)
                    if h is not None and key in self.undefined[h]:
                        self.undefined[h].discard(key)
                        self._cleared.append((h, key))
                        if not self.undefined[h]:
                            del self.undefined[h]
            self._pending.append((key, tuple(writes)))

    def submitted(self, value: int) -> None:
        with self._lock:
            self._cleared = []
            if self._pending:
                self._inflight.append((value, self._pending))
                self._pending = []

    def retired(self, value: int) -> None:
        """Submissions up to `value` completed: their writes are done."""
        with self._lock:
            if self._inflight and self._inflight[0][0] <= value:
                self._inflight = [(v, ls) for v, ls in self._inflight if v > value]

    def drop_after(self, reached: int) -> int:
        """The queue stopped with `reached` the last completed signal: mark what later submissions write. Returns
        how many allocations are undefined now. Launches built but not submitted yet keep waiting for their
        submission (to the restarted queue), but the marks they took away are put back: they have not run."""
        with self._lock:
            for v, launches in self._inflight:
                if v <= reached:
                    continue
                for key, writes in launches:
                    for addr in writes:
                        h = self._find(addr, self.handles)
                        if h is not None:
                            self.undefined.setdefault(h, set()).add(key)
            self._inflight = []
            self._restore()
            return len(self.undefined)

    def _restore(self) -> None:
        for va, k in self._cleared:
            if va in self.handles:
                self.undefined.setdefault(va, set()).add(k)
        self._cleared = []

    def forget(self, handle: VramBuffer) -> None:
        """Overwritten by the host (or freed): its bytes are defined (or no one's) again."""
        with self._lock:
            self.undefined.pop(handle.va, None)
            self._cleared = [(va, k) for va, k in self._cleared if va != handle.va]

    def freed(self, handle: VramBuffer) -> None:
        with self._lock:
            self.forget(handle)
            if self.handles.get(handle.va) is handle:
                del self.handles[handle.va]

    def check_read(self, addr: int, name: str, what: str) -> None:
        with self._lock:
            h = self._find(addr, self.undefined) if self.undefined else None
        if h is not None:
            raise BufferStateError(
                f"{what}: the {name} buffer at GPU address {addr:#x} (allocation {h:#x}) holds undefined data: the "
                "kernels that were to write it were dropped when the compute queue stopped on a fault or hang "
                "(reported then). Compute or load that tensor again (or copy new data into all of it from the host)"
            )

    def _find(self, addr: int, by_va: dict[int, Any]) -> int | None:
        """The va of the allocation in `by_va` (a dict keyed by va) that `addr` falls in, if any."""
        for va in by_va:
            h = self.handles.get(va)
            if h is not None and va <= addr < va + h.size:
                return va
        return None


class _UsbProgram(AMDProgram):
    """An AMD program on the USB device: each dispatch it builds is shown to the link's _DroppedWork (what it reads
    and writes, from the code object's argument access), so a compute-queue stop never leaves readable garbage."""

    device: UsbDevice

    def __init__(self, device: UsbDevice, name: str, lib: bytes, **spec: Any) -> None:
        super().__init__(device, name, lib, **spec)
        ptrs = [a for a in self.kernel_info.args if a.value_kind == "global_buffer"]
        self._reads = [i for i, a in enumerate(ptrs) if a.access in _READS]
        self._writes = [i for i, a in enumerate(ptrs) if a.access in _WRITES]

    def packets(self, words: Sequence[int], global_size: Sequence[int]) -> Any:
        key = (self, tuple(words), tuple(global_size))  # (the program itself: names repeat, addresses get reused)
        self.device.link.dropped.dispatch_built(
            key, [words[i] for i in self._reads], [words[i] for i in self._writes], self.device.name, self.name
        )
        return super().packets(words, global_size)


class _UsbAllocator(LinkAllocator):
    """The link allocator; a buffer freed into its cache holds no data any more (its undefined mark goes)."""

    link: UsbLink

    def free(self, opaque: Any, nbytes: int, options: BufferOptions = DEFAULT_OPTIONS) -> None:
        if self.link.owns(opaque):
            self.link.dropped.forget(opaque)
        super().free(opaque, nbytes, options)


class _SessionGuard:
    """Around the link's driver calls: a session left unusable (DeviceUnusableError: an earlier failure or
    interruption) is reported as the tensor-level DeviceUnavailableError naming Device[...].reopen(), and a
    KeyboardInterrupt that broke the session gets a note saying so (it is raised as itself)."""

    __slots__ = ("link",)

    def __init__(self, link: UsbLink) -> None:
        self.link = link

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        from speck.usbgpu.errors import DeviceUnusableError

        name = self.link.name
        what = (
            f"call Device[{name!r}].reopen() to open it again (tensors stored on it lose their data: compute or load "
            "them again after the reopen)"
        )
        if isinstance(exc, DeviceUnusableError):
            raise DeviceUnavailableError(
                f"{name} can't be used: {exc.libusb_message}. The driver session is in an unknown state; {what}"
            ) from exc
        if isinstance(exc, KeyboardInterrupt) and not self.link.gpu.usable:
            exc.add_note(f"speck.tensor: the interruption left {name} in an unknown state; {what}")


class _Staging:
    """Two page-aligned host buffers, locked in RAM when the memlock limit allows (pinning only saves page faults
    while the USB stack reads them, so a refused mlock changes nothing else)."""

    _libc: Any = None

    def __init__(self, nbytes: int) -> None:
        self.bufs = [HostMemory(nbytes), HostMemory(nbytes)]
        if _Staging._libc is None:
            _Staging._libc = ctypes.CDLL(None, use_errno=True)
        for b in self.bufs:
            _Staging._libc.mlock(ctypes.c_void_p(b.addr), ctypes.c_size_t(nbytes))


def _read_exactly(fd: int, view: memoryview, pos: int, path: str, start: int, total: int) -> None:
    """Fill `view` from file position `pos` (pread: no shared file offset, nothing cached in this process)."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], pos + got)
        if n == 0:
            raise HCQError(
                f"{path} ends at byte {pos + got}, but {total} bytes were to be read from offset {start}; the file "
                "is truncated or changed while it was being loaded"
            )
        got += n


class UsbDevice(AMDDevice):
    """A GPU behind a USB bridge as an hcq AMD device (speck.hcq.amd over a UsbLink): VRAM buffers, kernels from the
    AMD backend dispatched through the driver's PM4 compute queue, a copy queue of G3 copy-ins and copy-outs. `gpu`
    is the driver session (speck.usbgpu.api.UsbGpu)."""

    link: UsbLink

    def __init__(self, name: str, gpu: UsbGpu) -> None:
        self.gpu = gpu
        link = UsbLink(gpu, name)
        super().__init__(name, link, _UsbAllocator(name, link))
        self._stream_lock = threading.Lock()  # one streamed load at a time per device (each uses 2 staging buffers)

    def runtime(self, name: str, lib: bytes, **spec: Any) -> AMDProgram:
        if not isinstance(lib, (bytes, bytearray, memoryview)):
            return super().runtime(name, lib, **spec)  # (its error names what it expects)
        return _UsbProgram(self, name, bytes(lib), **spec)

    # -- lifetime -------------------------------------------------------------------------------------------------
    def reopen(self) -> None:
        """Close the driver session and open the bridge again: the way back after a Ctrl-C (or another failure)
        left the session unusable. The device object stays (Device[name] keeps returning it, compiled programs
        upload their code again); every buffer allocated before is lost - using a tensor stored on it raises
        DeviceUnavailableError - so compute or load those tensors again. The device's random counter restarts from
        the current seed (Tensor.manual_seed), as on a device that never drew."""
        try:
            self.gpu.close()
        except Exception:  # a session that can't even close (gone, broken): the new open takes the bridge over
            pass
        gpu = _open_gpu(self.name)
        self.gpu = gpu
        self.link.reconnect(gpu)
        self.relinked()
        # the old session's buffers hold a LostBuffer (as exchange_memory swaps memory: accounting unchanged, cached
        # addresses dropped), so reading one or giving it to a kernel raises instead of reaching VRAM now reused
        for buf in list(buffer_map_data.values()):
            if buf.dev is self and buf._base is None and buf._opaque is not None and not self.link.owns(buf._opaque):
                buf._opaque, buf._addr_of = LostBuffer(self.name, buf.nbytes), None
        Buffer.moves += 1  # (runner plans re-read the addresses of the buffers they hold)
        bounds.forget(self.name)
        _random.forget(self.name)  # (its random counter: the next draw starts one from the seed)
        # plans cached by structure hold graphs and buffers of the old session: a computation run before the reopen
        # would refuse to run again (a stale graph) or copy into lost VRAM; a new program-cache generation makes
        # every cached schedule build its plan again (programs of other devices are fetched from their caches)
        _realize._program_cache.clear()

    # -- copies ---------------------------------------------------------------------------------------------------
    def transfer(self, dest: Buffer, src: Buffer) -> None:
        """Copy all of `src` into `dest` (one of them on this device) through this device's copy queue: it waits on
        the other device's timelines for the work still producing `src`, runs the copy (a DISK source streams from
        its file), and advances this device's copy timeline. A copy out to another device is waited for here, so
        the host or the other device may use `dest` at once; a copy in is ordered before later host reads by the
        timeline (Buffer.copyout synchronizes)."""
        check_copy_size(f"copy from {src!r} to {dest!r}", dest.nbytes, src.nbytes)
        from speck.hcq.disk import DiskDevice, bool_bytes_fixed

        source: Buffer | FileRange = src
        if dest.dev is self and (fixed := bool_bytes_fixed(dest, src)) is not None:
            source = Buffer("CPU", len(fixed), fixed.dtype).copyin(fixed)  # (a file's bool bytes other than 0/1)
        elif isinstance(src.dev, DiskDevice) and dest.dev is self:
            # read the file, not its memory map (no page-cache RSS); a file not mapped yet is the one the path names
            # now. Once mapped, the tensor's bytes are the mapped file's: if the path names another file now (a save
            # over it after a lazy load), only the mapping still reads them
            if not src.is_allocated:
                source = FileRange(src.dev.path, src.offset)
            else:
                disk, mapping = src.dev.allocator, src.opaque
                assert isinstance(disk, DiskAllocator)
                disk.verify(mapping, src.offset, src.nbytes)  # (a zip member's CRC-32, when it has one)
                if _file_ident(src.dev.path) == mapping.ident:
                    source = FileRange(src.dev.path, src.offset, mapping.ident)
        self._submit_copy(dest, source, dest.nbytes, others=(dest.dev, src.dev), wait=dest.dev is not self)

    def load_file(self, dest: Buffer, path: str, offset: int) -> None:
        """Fill `dest` with the file's bytes [offset, offset + dest.nbytes), streamed disk -> pinned staging -> VRAM
        (G3) without holding the file in host memory; returns once they are in VRAM."""
        self._submit_copy(dest, FileRange(os.fspath(path), offset), dest.nbytes, others=(), wait=True)

    def _submit_copy(self, dest: Buffer, src: Buffer | FileRange, nbytes: int, others: tuple[DeviceLike, ...],
                     wait: bool) -> None:  # fmt: skip
        q = self.hw_queue("copy")
        for dev in {id(d): d for d in others if d is not self}.values():
            for e in dev.engines.values():
                if e.timeline.mem[0] < e.submitted:
                    q.wait(e.timeline, e.submitted)
        q.copy(dest, src, nbytes).submit(self)  # an idle engine runs it on this thread: errors are raised here
        if wait:
            engine = self.engines["copy"]
            engine.timeline.wait(engine.submitted)
            self.synchronize_if_busy()  # raises the copy's error when it ran on the engine's thread

    def _copy(self, dest: Any, src: Any, nbytes: int) -> None:
        """Execute a copy command of this device's queues. Allocator-level calls only: ordering against other
        devices came from the queue's waits, and a Buffer-level call would wait for this very command."""
        if not isinstance(dest, Buffer) or not isinstance(src, Buffer | FileRange):
            raise HCQError(f"{self.name} copies into Buffers from Buffers or file ranges, got {dest!r} <- {src!r}")
        if nbytes > dest.nbytes:
            raise HCQError(f"copy command of {nbytes} bytes does not fit {dest!r}")
        if isinstance(src, FileRange):
            if dest.dev is not self:
                raise HCQError(f"{self.name} streams files into its own buffers only, not into {dest!r}")
            self._stream_file(dest, src, nbytes)
            return
        link = self.link
        if dest.dev is self:
            if src.dev is self:  # within this VRAM: a copy kernel on the compute queue, in order with the kernels
                self.copy_in_memory(dest.ptr, src.ptr, nbytes)
                return
            if src.dev.host_visible:
                link.copyin(dest.opaque, dest.offset, src.dev.allocator.as_memoryview(src.opaque, src.offset, nbytes))
                return
            tmp = memoryview(bytearray(nbytes))  # from another bridge's VRAM: through the host
            src.dev.allocator.copyout(tmp, src.opaque, src.offset)
            link.copyin(dest.opaque, dest.offset, tmp)
            return
        if src.dev is not self:
            raise HCQError(f"{self.name} copy command between {src!r} and {dest!r}: neither is on this device")
        if dest.dev.host_visible:
            link.copyout(dest.dev.allocator.as_memoryview(dest.opaque, dest.offset, nbytes), src.opaque, src.offset)
            return
        tmp = memoryview(bytearray(nbytes))
        link.copyout(tmp, src.opaque, src.offset)
        dest.dev.allocator.copyin(dest.opaque, dest.offset, tmp)

    def _stream_file(self, dest: Buffer, src: FileRange, nbytes: int) -> None:
        """pread chunks into two pinned staging buffers; the G3 copy-in of one (asynchronous, on the driver's worker)
        overlaps the read of the next."""
        if nbytes == 0:
            return
        chunk = min(STAGING_CHUNK, nbytes)
        vbuf = dest.opaque
        self.link._settle()
        with self._stream_lock, open(src.path, "rb", buffering=0) as f:
            fd = f.fileno()
            st = os.fstat(fd)
            if src.ident is not None and (st.st_dev, st.st_ino) != src.ident:
                raise HCQError(
                    f"{src.path} was replaced by another file while a tensor of the old one was being copied to "
                    f"{self.name}; the copy would read the new file's bytes. Copy the tensor again"
                )
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, src.offset, nbytes, os.POSIX_FADV_SEQUENTIAL)
            staging = _Staging(chunk)
            pending: list[CopyHandle | None] = [None, None]
            try:
                for i, off in enumerate(range(0, nbytes, chunk)):
                    k = i & 1
                    if (h := pending[k]) is not None:  # the copy still reading this buffer
                        pending[k] = None
                        h.wait()
                    view = staging.bufs[k].mv[: min(chunk, nbytes - off)]
                    _read_exactly(fd, view, src.offset + off, src.path, src.offset, nbytes)
                    pending[k] = self.gpu.copyin_async(vbuf, view, dest.offset + off)
                last = i & 1
                for k in (last ^ 1, last):  # the older copy first: its error is the cause of the other's
                    if (h := pending[k]) is not None:
                        pending[k] = None
                        h.wait()
            finally:
                # on an error, never leave with a copy still reading staging memory (the driver's view keeps the
                # mapping alive, but the caller may retry at once); the first error is the one raised
                for h in pending:
                    if h is not None:
                        try:
                            h.wait()
                        except Exception:
                            pass

    def __repr__(self) -> str:
        return f"<Device {self.name} ({self.gpu!r})>"


# ---------------- registration ----------------
def _usb_suffix(rest: str) -> str | None:
    """USB, USB:<n>, and USB:SIM (which is USB itself when SPECK_USB_SIM puts simulated bridges on the bus)."""
    if rest.upper() == SIM_SUFFIX:
        return "" if _sim_bridges_from_env() else SIM_SUFFIX
    return numbered(rest)


def _sim_bridges_from_env() -> int:
    from speck.usbgpu.transport import sim_from_env

    return sim_from_env()


def open_usb(name: str) -> UsbDevice:
    """Open the bridge a canonical USB name denotes (driver errors become DeviceUnavailableError with the cause)."""
    return UsbDevice(name, _open_gpu(name))


def _open_gpu(name: str) -> UsbGpu:
    """A driver session on the bridge a canonical USB name denotes."""
    from speck.usbgpu.api import UsbGpu
    from speck.usbgpu.errors import UsbError

    suffix = name.partition(":")[2]
    try:
        if suffix == SIM_SUFFIX:
            from speck.usbgpu.sim import default_devices

            gpu = UsbGpu.open(0, sim=default_devices(max(1, _sim_bridges_from_env())))
        else:
            gpu = UsbGpu.open(int(suffix or 0))
        try:  # a card the bring-up did not run on (no opt-in) can neither copy nor compute: refuse it now
            gpu.context.require_ready(f"opening {name}")
        except UsbError:
            gpu.close()
            raise
    except UsbError as e:
        raise DeviceUnavailableError(
            f"cannot open {name}: {type(e).__name__}: {e}. For the simulator use USB:SIM, or set SPECK_USB_SIM=<n> "
            "to make USB ... USB:<n-1> simulated bridges"
        ) from e
    return gpu


def register() -> None:
    """Add the USB device kind to speck.hcq's registry when speck-usbgpu is installed (the `speck.devices` entry
    point of speck-tensor, also called when speck.tensor is imported)."""
    try:
        if importlib.util.find_spec("speck.usbgpu") is None:
            return
    except (ImportError, ValueError):  # a broken or blocked install counts as absent
        return
    register_device("USB", open_usb, suffix=_usb_suffix, forms=("USB", "USB:<n>", f"USB:{SIM_SUFFIX}"), probe=False,
                    serves=(AMDDevice.backend_name,))  # fmt: skip
