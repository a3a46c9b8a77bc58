"""Public API: open a USB-attached GPU, allocate VRAM, copy bytes in and out.

with UsbGpu.open(sim=True) as gpu:          # sim=True: the built-in simulator, no hardware needed
    buf = gpu.alloc(len(data))
    gpu.copyin(buf, data)
    out = bytearray(len(data))
    gpu.copyout(out, buf)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from speck.usbgpu.bridge import Transport
from speck.usbgpu.copyin import CopyEngine
from speck.usbgpu.errors import DeviceUnusableError
from speck.usbgpu.gpu import GpuContext, GpuOptions

if TYPE_CHECKING:
    from speck.usbgpu.sim.device import SimDevice

_BufferLike = bytes | bytearray | memoryview


@dataclass(frozen=True)
class VramBuffer:
    """A VRAM allocation: GPU virtual address and size in bytes (valid while its UsbGpu is open)."""

    va: int
    size: int
    owner: int  # id() of the UsbGpu session that allocated it

    def __len__(self) -> int:
        return self.size


def _sim_models(sim: Any) -> list[Any] | None:
    """Normalize UsbGpu.open's `sim` argument to the model list the transport takes."""
    if sim is None or sim is False:
        return None
    from speck.usbgpu.sim.config import SimFaults, SimTiming
    from speck.usbgpu.sim.device import SimDevice

    if sim is True:
        return [SimDevice()]
    if isinstance(sim, SimTiming):
        return [SimDevice(timing=sim)]
    if isinstance(sim, SimFaults):
        return [SimDevice(faults=sim)]
    if isinstance(sim, SimDevice):
        return [sim]
    if isinstance(sim, Sequence):
        return list(sim)
    raise TypeError(
        f"sim must be None, True, a SimTiming, a SimFaults, a SimDevice or a list of device models; "
        f"got {type(sim).__name__}"
    )


class UsbGpu:
    """A GPU behind an ASM2464-class bridge with the custom firmware, reached over libusb (or the simulator)."""

    def __init__(self, usb: Transport, options: GpuOptions, models: list[Any] | None = None) -> None:
        self._usb: Transport | None = usb
        self.models = models or []
        try:
            self._ctx = GpuContext(usb, options)
        except BaseException:
            usb.close()
            raise
        self._copy = CopyEngine(self._ctx)
        self._broken: str | None = None

    @classmethod
    def open(
        cls,
        index: int = 0,
        sim: Any = None,
        *,
        mode: str | None = None,
        f4gate: bool | None = None,
        poll_limit: int | None = None,
        zero_copy: bool | None = None,
    ) -> UsbGpu:
        """Open the `index`-th bridge (or the simulator), bring the PCIe link and the GPU's copy queue up.

        `sim`: None for hardware (or the simulator if SPECK_USB_SIM=1), True for a default simulated device, a
        SimTiming or SimFaults for a simulated device built with it, a SimDevice, or a list of device models.
        `mode` selects the copy-in ("g3" pipelined, default; "g0" serial; env USB_COPYIN), `f4gate=False` the
        0xF2 + E4 fence gate instead of 0xF4 (env USB_F4GATE=0), `poll_limit` the number of fence polls before
        GpuFenceTimeout, `zero_copy=False` the reference G3 wire (each chunk staged into one bulk transfer; env
        USB_ZEROCOPY=0) instead of payload sent straight from `data`.
        """
        from speck.usbgpu.transport import UsbTransport

        options = GpuOptions.from_env(mode, f4gate, poll_limit, zero_copy)
        models = _sim_models(sim)
        usb = UsbTransport.open(index, sim=models)
        if models is None and getattr(usb, "simulated", False):  # SPECK_USB_SIM=1: the transport made the model
            from speck.usbgpu.sim.shim import installed_models

            models = list(installed_models())
        return cls(usb, options, models)

    # ------------------------------------------------------------------ properties
    @property
    def sim(self) -> SimDevice | None:
        """The simulated device behind this session, if any."""
        from speck.usbgpu.sim.device import SimDevice

        return next((m for m in self.models if isinstance(m, SimDevice)), None)

    @property
    def transport(self) -> Transport:
        return self._live()

    @property
    def context(self) -> GpuContext:
        return self._ctx

    @property
    def copy_stats(self) -> Any:
        return self._copy.stats

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

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int) -> VramBuffer:
        """Allocate `nbytes` of VRAM."""
        self._live()
        return VramBuffer(self._ctx.alloc(nbytes), nbytes, id(self))

    @staticmethod
    def _bytes_view(data: object, verb: str) -> memoryview:
        try:
            view = memoryview(data)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{verb} needs a bytes-like object, got {type(data).__name__}") from None
        if not view.contiguous:
            raise ValueError(f"{verb} needs a contiguous buffer; copy the strided view first (bytes(view))")
        return view.cast("B")

    def _check(self, buf: VramBuffer, offset: int, nbytes: int, verb: str) -> None:
        if not isinstance(buf, VramBuffer):
            raise TypeError(f"{verb} needs a VramBuffer from UsbGpu.alloc, got {type(buf).__name__}")
        if buf.owner != id(self):
            raise ValueError(f"{verb}: the VramBuffer belongs to another UsbGpu session; allocate it on this one")
        if offset < 0 or offset + nbytes > buf.size:
            raise ValueError(
                f"{verb} of {nbytes} bytes at offset {offset} does not fit the {buf.size}-byte buffer; "
                "allocate a larger buffer or use a smaller offset"
            )

    def copyin(self, buf: VramBuffer, data: _BufferLike, offset: int = 0) -> None:
        """Copy `data` into `buf` at byte `offset`; returns once the data is in VRAM."""
        self._live()
        mv = self._bytes_view(data, "copyin")
        self._check(buf, offset, len(mv), "copyin")
        self._run(lambda: self._copyin(buf.va + offset, mv), "copyin")

    def _copyin(self, dest: int, mv: memoryview) -> None:
        if self._ctx.options.mode == "g0":
            self._copy.copyin_g0(dest, mv)
        else:
            self._copy.copyin_g3(dest, mv)

    def copyout(self, out: bytearray | memoryview, buf: VramBuffer, offset: int = 0) -> None:
        """Fill `out` (a writable buffer) from `buf` starting at byte `offset`."""
        self._live()
        mv = self._bytes_view(out, "copyout")
        if mv.readonly:
            raise TypeError("copyout needs a writable buffer (bytearray or writable memoryview), got a read-only one")
        self._check(buf, offset, len(mv), "copyout")
        self._run(lambda: self._copy.copyout(mv, buf.va + offset), "copyout")

    def _run(self, fn: Any, what: str) -> None:
        try:
            fn()
        except BaseException as exc:
            # The bridge/GPU state is unknown after a failure mid-protocol: refuse further use until reopened.
            self._broken = f"{what}: {exc}"
            raise

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the device (idempotent)."""
        usb, self._usb = self._usb, None
        if usb is not None:
            usb.close()

    def __enter__(self) -> UsbGpu:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
