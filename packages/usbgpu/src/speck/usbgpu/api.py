"""Public API: open a USB-attached GPU, allocate and free VRAM, copy bytes in and out (blocking or asynchronous).

with UsbGpu.open(sim=True) as gpu:          # sim=True: the built-in simulator, no hardware needed
    buf = gpu.alloc(len(data))
    gpu.copyin(buf, data)
    out = bytearray(len(data))
    handle = gpu.copyout_async(out, buf)    # runs on the device's worker thread
    handle.wait()
    gpu.free(buf)

Every operation of one UsbGpu - from any thread, blocking or asynchronous - runs alone and in the order it was
issued (speck.usbgpu.opqueue). Arguments are checked when an operation is issued, before anything reaches the
device.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from speck.usbgpu.amd.compute import KernelCode
from speck.usbgpu.amd.layout import KERNARG_POOL
from speck.usbgpu.bridge import Transport
from speck.usbgpu.compute import DEFAULT_TIMEOUT_S, ComputeEngine, QueueStatus
from speck.usbgpu.copyin import CopyEngine, Progress
from speck.usbgpu.errors import (
    CopyCancelledError,
    DeviceUnusableError,
    F4BailError,
    GpuFault,
    GpuFenceTimeout,
    GpuHang,
    UsbGpuTypeError,
    UsbGpuUsageError,
    UsbGpuValueError,
    UsbTimeoutError,
)
from speck.usbgpu.gpu import HEAP_VA, GpuContext, GpuOptions
from speck.usbgpu.opqueue import CopyHandle, OpQueue

if TYPE_CHECKING:
    from speck.usbgpu.sim.config import SimFaults, SimTiming
    from speck.usbgpu.sim.device import SimDevice
    from speck.usbgpu.sim.model_api import UsbDeviceModel

__all__ = ["CopyHandle", "KernelCode", "ProgressCallback", "QueueStatus", "UsbGpu", "VramBuffer"]

_BufferLike = bytes | bytearray | memoryview
ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes in all), called from the thread running the copy
_SESSIONS = itertools.count(1)
INTERRUPTED = (
    "speck.usbgpu: {what} was interrupted after {done} of {total} bytes. The bridge and GPU are now in an unknown "
    "state, so this UsbGpu refuses further operations: close it and open the device again - UsbGpu.open resets "
    "the USB endpoints, the SDMA queue, the fence flags and the bounce buffers, and the device is fully usable "
    "after that reopen (data copied before the interruption is still in VRAM)."
)


@dataclass(frozen=True)
class VramBuffer:
    """A VRAM allocation: GPU virtual address and size in bytes, valid until freed or its UsbGpu is closed.

    Only buffers returned by UsbGpu.alloc are accepted by the copy calls; a VramBuffer built by hand is refused.
    """

    va: int
    size: int
    owner: int  # the session number of the UsbGpu that allocated it

    def __len__(self) -> int:
        return self.size


def _sim_models(sim: object) -> list[UsbDeviceModel] | None:
    """Normalize UsbGpu.open's `sim` argument to the model list the transport takes (None: hardware/env)."""
    if sim is None:
        return None
    from speck.usbgpu.sim.config import SimFaults, SimTiming
    from speck.usbgpu.sim.device import SimDevice
    from speck.usbgpu.sim.model_api import UsbDeviceModel

    if sim is True:
        return [SimDevice()]
    if isinstance(sim, SimTiming):
        return [SimDevice(timing=sim)]
    if isinstance(sim, SimFaults):
        return [SimDevice(faults=sim)]
    if isinstance(sim, SimDevice):
        return [sim]
    if isinstance(sim, Sequence) and not isinstance(sim, str | bytes | bytearray):
        models = list(sim)
        bad = [type(m).__name__ for m in models if not isinstance(m, UsbDeviceModel)]
        if not bad:
            return models
        raise UsbGpuTypeError(
            f"sim=[...] must hold device models (SimDevice or UsbDeviceModel); found {', '.join(bad)}"
        )
    raise UsbGpuTypeError(
        "sim must be None (hardware, or the simulator when SPECK_USB_SIM is set), False (hardware only), True (a "
        f"new simulated device), a SimTiming, a SimFaults, a SimDevice or a list of device models; got {sim!r}"
    )


def _count(value: object, what: str) -> int:
    """`value` as a non-negative int (any integer type, not bool or float), else a TypeError/ValueError."""
    if isinstance(value, bool):
        raise UsbGpuTypeError(f"{what} must be an int, got a bool ({value!r})")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise UsbGpuTypeError(f"{what} must be an int, got {type(value).__name__} {value!r}") from None
    if n < 0:
        raise UsbGpuValueError(f"{what} must be >= 0, got {n}")
    return int(n)


def _dwords(packets: object) -> list[int]:
    """`packets` as a list of PM4 dwords: ints in [0, 2**32) (a larger or negative one was masked to 32 bits and
    the GPU ran other packets than the caller wrote), else a TypeError/ValueError naming the first bad one."""
    try:
        body = list(packets)  # type: ignore[call-overload]
    except TypeError:
        raise UsbGpuTypeError(f"submit needs a sequence of PM4 dwords (ints), got {type(packets).__name__}") from None
    for i, p in enumerate(body):
        if isinstance(p, bool) or not hasattr(type(p), "__index__"):
            raise UsbGpuTypeError(f"submit: packet dword {i} must be an int, got {type(p).__name__} {p!r:.40}")
        if not 0 <= operator.index(p) <= 0xFFFFFFFF:
            raise UsbGpuValueError(f"submit: packet dword {i} is {p}, outside [0, 0xFFFFFFFF]; PM4 dwords are "
                                   "32-bit unsigned (a negative one: p & 0xFFFFFFFF)")  # fmt: skip
    return [operator.index(p) for p in body]


def _timeout(value: object) -> float:
    """A wait's timeout in seconds: a finite number >= 0 (NaN or infinity never ends the wait of a hung queue)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsbGpuTypeError(f"timeout must be a number of seconds, got {type(value).__name__} {value!r:.40}")
    if not 0 <= value < float("inf"):
        raise UsbGpuValueError(f"timeout must be a finite number of seconds >= 0, got {value!r}; pass e.g. 10.0")
    return float(value)


def _dims(value: object, what: str) -> tuple[int, ...]:
    """A grid or block: 1 to 3 ints in [1, 2**32) (a 4th was dropped, 1.5 became 1, a dim of 2**32 wrapped)."""
    try:
        dims: tuple[Any, ...] = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise UsbGpuTypeError(f"{what} must be a sequence of 1 to 3 ints, got {type(value).__name__}") from None
    if not 1 <= len(dims) <= 3 or any(isinstance(n, bool) or not hasattr(type(n), "__index__") for n in dims):
        raise UsbGpuTypeError(f"{what} must be 1 to 3 ints (x, y, z), got {value!r:.60}")
    if not all(1 <= operator.index(n) <= 0xFFFFFFFF for n in dims):
        raise UsbGpuValueError(f"{what} {value!r} needs every dim in [1, 0xFFFFFFFF]")
    return tuple(operator.index(n) for n in dims)


def _launch_args(code: object, grid: object, block: object, kernargs: object) -> tuple[Any, ...]:
    """dispatch()'s arguments checked when it is issued (an AttributeError from inside the operation made the
    session unusable)."""
    if not isinstance(code, KernelCode):
        raise UsbGpuTypeError(f"dispatch needs a KernelCode (speck.usbgpu.KernelCode), got {type(code).__name__}")
    if isinstance(kernargs, str) or not isinstance(kernargs, (bytes, bytearray, memoryview)):
        raise UsbGpuTypeError(f"kernargs must be bytes, got {type(kernargs).__name__}; pack them (struct.pack)")
    return code, _dims(grid, "grid"), _dims(block, "block"), bytes(kernargs)


class UsbGpu:
    """A GPU behind an ASM2464-class bridge with the custom firmware, reached over libusb (or the simulator)."""

    # what `wait` raises when the compute queue stopped (a kernel fault, a hang); `reset_queue` restarts it
    queue_stops: ClassVar[tuple[type[Exception], ...]] = (GpuFault, GpuHang)

    def __init__(self, usb: Transport, options: GpuOptions, models: list[Any] | None = None) -> None:
        self._usb: Transport | None = usb
        self.models = models or []
        try:
            self._ctx = GpuContext(usb, options)
        except BaseException:
            usb.close()
            raise
        self._copy = CopyEngine(self._ctx) if self._ctx.ready else None  # copies need the bring-up
        self._broken: str | None = None
        self.session = next(_SESSIONS)
        self._allocs: dict[int, VramBuffer] = {}
        self._mapped: set[int] = set()  # buffers (by address) the GPU's page tables map; only queued jobs touch it
        self._unmapped: dict[int, VramBuffer] = {}  # allocated, mapped by the next operation that reaches the GPU
        self._compute: ComputeEngine | None = None
        self._bytes_done = 0  # progress of the copy running now (quoted when it is interrupted)
        self._heap_lock = threading.Lock()
        self.name: str = getattr(usb, "name", "?")  # "usb:<bus>-<address>"
        if self.sim is not None:
            self._ctx.explain = self.sim.gpu.explain
        self._queue = OpQueue(f"UsbGpu {self.name}")

    @classmethod
    def open(
        cls,
        index: int = 0,
        sim: bool | SimTiming | SimFaults | SimDevice | Sequence[UsbDeviceModel] | None = None,
        *,
        mode: str | None = None,
        f4gate: bool | None = None,
        poll_limit: int | None = None,
        zero_copy: bool | None = None,
        unverified: bool | None = None,
        firmware: str | os.PathLike[str] | Mapping[str, bytes] | None = None,
    ) -> UsbGpu:
        """Open the `index`-th bridge (or the simulator), bring the PCIe link, the BARs and the GPU's queue up.

        `sim`: None for hardware, or the simulator when SPECK_USB_SIM is set (SPECK_USB_SIM=<n> puts n default
        simulated bridges on the bus, the same objects for the whole process); False for hardware only; True for a
        new simulated device; a SimTiming or SimFaults for a new device built with it; a SimDevice; or a list of
        device models (index picks among them). A new model list replaces the simulated bus, so sessions still open
        on the old models see NO_DEVICE.
        `mode` selects the copy-in ("g3" pipelined, default; "g0" serial; env USB_COPYIN), `f4gate=False` the
        0xF2 + E4 fence gate instead of 0xF4 (env USB_F4GATE=0), `poll_limit` the number of fence polls before
        GpuFenceTimeout, `zero_copy=False` the reference G3 wire (each chunk staged into one bulk transfer; env
        USB_ZEROCOPY=0) instead of payload sent straight from `data`. `unverified=True` (env
        SPECK_USBGPU_UNVERIFIED=1) runs the register-writing bring-up on a board it was not verified on (any real card
        today); without it such a card is identified and then left alone, and copies raise GpuBringUpUnverified.
        `firmware`: where the AMD firmware files come from - a directory (default /lib/firmware/amdgpu, env
        SPECK_AMDGPU_FIRMWARE) or {file name: bytes}; a simulated card hands over its own set.

        A bridge is opened by one session at a time: a second open in this process, or in another process, raises
        DeviceInUseError before anything is sent to the device.
        """
        from speck.usbgpu.transport import UsbTransport

        index = _count(index, "device index")
        for name, flag in (("f4gate", f4gate), ("zero_copy", zero_copy), ("unverified", unverified)):
            if flag is not None and not isinstance(flag, bool):
                raise UsbGpuTypeError(f"{name} must be True, False or None, got {flag!r}")
        if mode is not None and not isinstance(mode, str):
            raise UsbGpuTypeError(f"mode must be 'g3' or 'g0', got {mode!r}")
        source = os.fspath(firmware) if isinstance(firmware, os.PathLike) else firmware
        options = GpuOptions.from_env(mode, f4gate, poll_limit, zero_copy, unverified, source)
        if sim is False:
            usb = UsbTransport.open(index, sim=None, hardware_only=True)
            return cls(usb, options, None)
        models = _sim_models(sim)
        usb = UsbTransport.open(index, sim=models)
        if models is None and usb.simulated:  # SPECK_USB_SIM: the transport put the default models on the bus
            from speck.usbgpu.sim.shim import installed_models

            models = list(installed_models())
        if options.firmware is None:  # a simulated card brings its own firmware files
            for model in models or []:
                if f"usb:{model.bus}-{model.address}" == getattr(usb, "name", "") and hasattr(model, "firmware_files"):
                    options = replace(options, firmware=model.firmware_files())
        return cls(usb, options, models)

    # ------------------------------------------------------------------ properties
    @property
    def sim(self) -> SimDevice | None:
        """The simulated device behind this session, if any."""
        from speck.usbgpu.sim.device import SimDevice

        devices = [m for m in self.models if isinstance(m, SimDevice)]
        for dev in devices:  # the model the transport opened (several may be on the bus)
            if f"usb:{dev.bus}-{dev.address}" == self.name:
                return dev
        return devices[0] if devices else None

    @property
    def simulated(self) -> bool:
        """Whether this session runs against the simulator."""
        return bool(getattr(self._usb, "simulated", False)) or self.sim is not None

    @property
    def usable(self) -> bool:
        """Whether operations are accepted: not closed, and no earlier failure or interruption (DeviceUnusableError
        otherwise; close and open the device again)."""
        return self._usb is not None and self._broken is None

    @property
    def transport(self) -> Transport:
        return self._live()

    @property
    def context(self) -> GpuContext:
        return self._ctx

    @property
    def copy_stats(self) -> Any:
        return self._engine().stats

    @property
    def doorbells(self) -> int:
        """Doorbells rung by this session (G3: exactly one per non-empty copy-in)."""
        return self._ctx.ring.doorbells

    def _live(self) -> Transport:
        if self._usb is None:
            raise DeviceUnusableError("UsbGpu", "the device is closed")
        if self._broken is not None:
            raise DeviceUnusableError("UsbGpu", f"an earlier operation failed ({self._broken})")
        return self._usb

    def _engine(self) -> CopyEngine:
        if self._copy is None:
            self._copy = CopyEngine(self._ctx)  # raises GpuBringUpUnverified where the bring-up did not run
        return self._copy

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> VramBuffer:
        """Allocate `nbytes` of VRAM (page aligned). Host bookkeeping only: it does not wait for queued copies."""
        nbytes = _count(nbytes, "allocation size")
        self._live()
        with self._heap_lock:
            buf = VramBuffer(self._ctx.heap.alloc(nbytes), nbytes, self.session)
            self._allocs[buf.va] = buf
            self._unmapped[buf.va] = buf
        return buf

    def free(self, buf: VramBuffer) -> None:
        """Give `buf` back for reuse, once every operation issued before this call (which may use it) is done.
        Using `buf` after this raises ValueError."""
        self._check_buffer(buf, 0, 0, "free")

        def release() -> None:
            self._check_buffer(buf, 0, 0, "free")
            with self._heap_lock:
                self._unmapped.pop(buf.va, None)
            if buf.va in self._mapped:
                self._mapped.discard(buf.va)
                self._ctx.unmap_heap(buf.va, buf.size)
            with self._heap_lock:
                self._ctx.heap.free(buf.va)
                del self._allocs[buf.va]

        self._queue.run(release)

    def _map_new(self) -> None:
        """Map every buffer allocated since the last operation into the GPU's VM (run inside an operation: the GPU
        reaches any live buffer from then on, whatever a kernel's arguments point at)."""
        if not self._ctx.ready:
            return
        with self._heap_lock:
            bufs, self._unmapped = list(self._unmapped.values()), {}
        if bufs:
            self._ctx.map_heap([(b.va, b.size) for b in bufs])
            self._mapped.update(b.va for b in bufs)

    def _mapped_then(self, buf: VramBuffer, fn: Callable[[], None]) -> None:
        """Map new buffers into the GPU's VM, then run `fn` (inside the operation)."""
        self._map_new()
        fn()

    def _check_buffer(self, buf: object, offset: int, nbytes: int, verb: str) -> VramBuffer:
        if not isinstance(buf, VramBuffer):
            raise UsbGpuTypeError(f"{verb} needs a VramBuffer from UsbGpu.alloc, got {type(buf).__name__}")
        if buf.owner != self.session:
            raise UsbGpuValueError(f"{verb}: the VramBuffer belongs to another UsbGpu session; allocate it on this one")
        if self._allocs.get(buf.va) is not buf:  # identity: a copy or a stale handle never passes for a live one
            what = (
                "it points into the driver's own VRAM (SDMA ring, queue pointers, timeline signal)"
                if buf.va < HEAP_VA
                else "it was freed, or was not made by UsbGpu.alloc"
                if buf.va not in self._allocs
                else "it was freed and its VRAM handed out again, or was not made by UsbGpu.alloc"
            )
            raise UsbGpuValueError(
                f"{verb}: {buf} is not a live allocation of this UsbGpu ({what}); use a buffer returned by "
                "UsbGpu.alloc and not yet freed"
            )
        if offset + nbytes > buf.size:
            raise UsbGpuValueError(
                f"{verb} of {nbytes} bytes at offset {offset} does not fit the {buf.size}-byte buffer; "
                "allocate a larger buffer or use a smaller offset"
            )
        return buf

    @staticmethod
    def _bytes_view(data: object, verb: str) -> memoryview:
        try:
            view = memoryview(data)  # type: ignore[arg-type]
        except TypeError:
            raise UsbGpuTypeError(f"{verb} needs a bytes-like object, got {type(data).__name__}") from None
        if "O" in view.format:  # (Python object pointers: copied out they are garbage, copied in they crash)
            raise UsbGpuTypeError(f"{verb} needs a buffer of plain data, got one of Python objects (format "
                                  f"{view.format!r}); convert it to a numeric array first")  # fmt: skip
        if view.nbytes == 0:  # (cast() refuses a shape with a 0 in it; no bytes is no bytes)
            return memoryview(b"") if view.readonly else memoryview(bytearray())
        if not view.c_contiguous:  # (a Fortran-order array is contiguous too, but cast() reads only C order)
            raise UsbGpuValueError(f"{verb} needs a C-contiguous buffer, got a strided or Fortran-order one; copy it "
                                   "first (bytes(view), or numpy.ascontiguousarray)")  # fmt: skip
        return view.cast("B")

    # ------------------------------------------------------------------ copies
    def copyin(
        self, buf: VramBuffer, data: _BufferLike, offset: int = 0, *, progress: ProgressCallback | None = None
    ) -> None:
        """Copy `data` into `buf` at byte `offset`; returns once the data is in VRAM.

        `progress(done, total)` is called as the copy advances (per 240 KiB chunk) and once at the end; an
        exception it raises aborts the copy (and, like any failure mid-copy, leaves the session unusable)."""
        job, _ = self._copyin_job(buf, data, offset, progress)
        self._queue.run(lambda: job(None))

    def copyin_async(
        self, buf: VramBuffer, data: _BufferLike, offset: int = 0, *, progress: ProgressCallback | None = None
    ) -> CopyHandle:
        """Queue a copy-in and return at once; `handle.wait()` returns when the data is in VRAM (or raises).
        `data` must stay alive and unchanged until then."""
        job, nbytes = self._copyin_job(buf, data, offset, progress)
        return self._queue.submit(job, CopyHandle("copyin", nbytes))

    def copyout(
        self, out: bytearray | memoryview, buf: VramBuffer, offset: int = 0, *, progress: ProgressCallback | None = None
    ) -> None:
        """Fill `out` (a writable buffer) from `buf` starting at byte `offset` (`progress` as for copyin)."""
        job, _ = self._copyout_job(out, buf, offset, progress)
        self._queue.run(lambda: job(None))

    def copyout_async(
        self, out: bytearray | memoryview, buf: VramBuffer, offset: int = 0, *, progress: ProgressCallback | None = None
    ) -> CopyHandle:
        """Queue a copy-out and return at once; `out` holds the data once `handle.wait()` returns."""
        job, nbytes = self._copyout_job(out, buf, offset, progress)
        return self._queue.submit(job, CopyHandle("copyout", nbytes))

    def synchronize(self) -> None:
        """Return once every operation issued before this call has finished; DeviceUnusableError if one failed."""
        self._queue.run(self._live)

    # ------------------------------------------------------------------ compute
    def _engine_compute(self) -> ComputeEngine:
        """The session's compute queue (its staging pool is allocated on first use)."""
        if self._compute is None:
            self._ctx.require_ready("compute")
            pool = self._ctx.heap.alloc(KERNARG_POOL)
            self._ctx.map_heap([(pool, KERNARG_POOL)])
            self._compute = ComputeEngine(self._ctx, (pool, KERNARG_POOL))
            if self._copy is not None:
                self._copy.after = self._compute_fence
        return self._compute

    def _compute_fence(self) -> tuple[int, int] | None:
        """(signal address, value) copies must wait for on the GPU before touching VRAM (the last submission)."""
        c = self._compute
        return None if c is None or not c.submitted else (c.signal.va, c.submitted)

    def _compute_op(self, what: str, fn: Callable[[ComputeEngine], Any]) -> Any:
        """Run `fn` on the compute queue as an operation of this session. A fault or hang of the queue raises
        GpuFault / GpuHang and leaves the session usable (reset_queue() restarts the queue); anything else that
        fails mid-operation leaves it unusable, as a failed copy does."""
        self._ctx.require_ready(what)
        what = f"compute queue {what}()"  # names the call in a later DeviceUnusableError, not a bare "completed"

        def job() -> Any:
            self._live()
            try:
                self._map_new()
                return fn(self._engine_compute())
            except (GpuFault, GpuHang):
                raise
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    self._broken = f"{what}: interrupted (KeyboardInterrupt)"
                elif not isinstance(exc, ValueError | TypeError):  # argument errors are caught before the device
                    self._broken = f"{what}: {type(exc).__name__}: {exc}"
                raise

        return self._queue.run(job)

    def upload(self, code: bytes | bytearray | memoryview) -> VramBuffer:
        """Copy a code object's loaded image (code and kernel descriptors) into VRAM; returns its buffer. A kernel's
        KernelCode.entry is the buffer's address plus the entry's offset in the image (256-byte aligned)."""
        mv = self._bytes_view(code, "upload")
        buf = self.alloc(len(mv))
        self.copyin(buf, mv)
        return buf

    def launch_packets(
        self, code: KernelCode, grid: Sequence[int], block: Sequence[int], kernargs: bytes = b""
    ) -> list[int]:
        """The PM4 of one dispatch (its kernarg segment and dispatch packet staged in VRAM), for a batch built by
        the caller and submitted with submit(..., batch=True)."""
        code, grid, block, kernargs = _launch_args(code, grid, block, kernargs)
        return list(self._compute_op("dispatch", lambda c: c.launch(code, grid, block, kernargs)))

    def dispatch(
        self,
        code: KernelCode,
        grid: Sequence[int],
        block: Sequence[int],
        kernargs: bytes = b"",
        *,
        wait: bool = False,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> int:
        """Run `grid` workgroups of `block` threads of `code` with `kernargs`; returns the compute timeline value
        that signals its completion (`wait=True` also waits for it, up to `timeout` seconds of GPU time)."""
        timeout = _timeout(timeout)
        code, grid, block, kernargs = _launch_args(code, grid, block, kernargs)

        def go(c: ComputeEngine) -> int:
            value = c.submit(c.launch(code, grid, block, kernargs))
            if wait:
                c.wait(value, timeout)
            return value

        return int(self._compute_op("dispatch", go))

    def submit(self, packets: Sequence[int], *, batch: bool = False) -> int:
        """Submit PM4 packets to the compute queue, followed by a RELEASE_MEM of the next timeline value (returned).
        `batch=True` stages them as one indirect buffer: one INDIRECT_BUFFER packet and one doorbell."""
        body = _dwords(packets)
        return int(self._compute_op("submit", lambda c: c.submit(body, batch=batch)))

    def wait(self, value: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        """Return once the compute timeline reached `value`. GpuFault if a queue reported a fault, GpuHang if one
        hung or nothing signalled within `timeout` seconds of GPU time (both name the queue)."""
        value, timeout = _count(value, "wait value"), _timeout(timeout)

        def go(c: ComputeEngine) -> None:
            if value > c.submitted:  # (it timed out, and the queue was then taken as hung until reset)
                raise UsbGpuValueError(f"wait({value}): only {c.submitted} compute submissions were made; wait for a "
                                       "value that submit() or dispatch() returned")  # fmt: skip
            c.wait(value, timeout)

        self._compute_op("wait", go)

    def completed(self) -> int:
        """The last compute timeline value the GPU signalled."""
        return int(self._compute_op("completed", lambda c: c.completed()))

    def queue_status(self) -> QueueStatus:
        """The compute queue's state: active, read/write pointers, signalled/submitted values, fault records."""
        status: QueueStatus = self._compute_op("queue_status", lambda c: c.status())
        return status

    def reset_queue(self) -> None:
        """Dequeue and re-create the compute queue: whatever it ran or was stuck on is dropped, its fault records
        are cleared, and waits for dropped work return. The session stays usable."""
        self._compute_op("reset_queue", lambda c: c.reset())

    def _copyin_job(
        self, buf: VramBuffer, data: _BufferLike, offset: int, progress: ProgressCallback | None
    ) -> tuple[Callable[[CopyHandle | None], None], int]:
        offset = _count(offset, "copyin offset")
        mv = self._bytes_view(data, "copyin")
        self._check_buffer(buf, offset, len(mv), "copyin")
        self._live()
        self._ctx.require_ready("copyin")

        def job(handle: CopyHandle | None) -> None:
            if handle is not None and handle.cancel_requested:
                raise CopyCancelledError(f"copyin of {len(mv)} bytes", "cancelled before it ran (UsbGpu closed)")
            self._check_buffer(buf, offset, len(mv), "copyin")  # a free issued since may have taken it
            engine = self._engine()
            hook = self._hook("copyin", len(mv), progress, handle)
            run = engine.copyin_g0 if self._ctx.options.mode == "g0" else engine.copyin_g3
            self._execute("copyin", len(mv), lambda: self._mapped_then(buf, lambda: run(buf.va + offset, mv, hook)))

        return job, len(mv)

    def _copyout_job(
        self, out: bytearray | memoryview, buf: VramBuffer, offset: int, progress: ProgressCallback | None
    ) -> tuple[Callable[[CopyHandle | None], None], int]:
        offset = _count(offset, "copyout offset")
        mv = self._bytes_view(out, "copyout")
        if mv.readonly:
            raise UsbGpuTypeError(
                "copyout needs a writable buffer (bytearray or writable memoryview), got a read-only one"
            )
        self._check_buffer(buf, offset, len(mv), "copyout")
        self._live()
        self._ctx.require_ready("copyout")

        def job(handle: CopyHandle | None) -> None:
            if handle is not None and handle.cancel_requested:
                raise CopyCancelledError(f"copyout of {len(mv)} bytes", "cancelled before it ran (UsbGpu closed)")
            self._check_buffer(buf, offset, len(mv), "copyout")
            engine = self._engine()
            hook = self._hook("copyout", len(mv), progress, handle)
            self._execute(
                "copyout", len(mv), lambda: self._mapped_then(buf, lambda: engine.copyout(mv, buf.va + offset, hook))
            )

        return job, len(mv)

    def _hook(self, kind: str, total: int, user: ProgressCallback | None, handle: CopyHandle | None) -> Progress:
        """The engine's progress hook: track bytes done, stop a cancelled async copy, call the user's callback."""
        self._bytes_done = 0

        def hook(done: int) -> None:
            self._bytes_done = done
            if handle is not None:
                handle.bytes_done = done
                if handle.cancel_requested and done < total:
                    raise CopyCancelledError(
                        f"{kind} of {total} bytes", f"cancelled after {done} bytes (UsbGpu closed)"
                    )
            if user is not None:
                user(done, total)

        return hook

    def _execute(self, kind: str, total: int, fn: Callable[[], None]) -> None:
        """Run one copy on the device; any failure (including Ctrl-C) leaves the session unusable until reopened."""
        self._live()
        try:
            try:
                fn()
            except (GpuFenceTimeout, UsbTimeoutError, F4BailError) as exc:  # GpuHang included
                culprit = self._stuck_behind_compute(f"{kind} of {total} bytes", exc)
                if culprit is None:
                    raise
                raise culprit from exc
        except BaseException as exc:
            what = f"{kind} of {total} bytes"
            self._broken = f"{what}: {type(exc).__name__}: {exc}"
            if isinstance(exc, KeyboardInterrupt):
                exc.add_note(INTERRUPTED.format(what=f"the {what}", done=self._bytes_done, total=total))
                self._broken = f"{what}: interrupted (KeyboardInterrupt) after {self._bytes_done} bytes"
            raise

    def _stuck_behind_compute(self, what: str, exc: BaseException) -> GpuFault | GpuHang | None:
        """A copy waits on the GPU for the compute work issued before it: when it timed out (or its SDMA queue was
        declared hung) while that work never finished, the compute queue is what hung - name it."""
        c = self._compute
        if c is None or (isinstance(exc, GpuHang) and exc.queue == c.queue_name):
            return None
        try:
            return c.blocking(what)
        except Exception:  # the device cannot be asked (gone, broken): report the copy's own error
            return None

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the device (idempotent). Queued asynchronous copies are cancelled (their wait() raises
        CopyCancelledError) and a running one stops at its next chunk; the call returns once it has."""
        if self._usb is None:
            return
        if self._queue.in_operation():
            raise UsbGpuUsageError(
                "UsbGpu.close() called from inside one of its operations (a progress callback?); to abort a copy "
                "from its progress callback, raise an exception there, then close"
            )
        self._queue.cancel_queued()
        self._queue.run(self._close_now)

    def _close_now(self) -> None:
        usb, self._usb = self._usb, None
        if usb is not None:
            usb.close()

    def __enter__(self) -> UsbGpu:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._usb is None else "unusable" if self._broken else "open"
        kind = "simulated" if self.simulated else "hardware"
        return f"<UsbGpu {self.name} {kind} {state}>"
