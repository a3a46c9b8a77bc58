"""speck.usbgpu's USB transport: open the bridge, sync control/bulk through python-libusb1, async bulk OUT through
the C helper - both on the same libusb context and device handle.

Which libusb gets loaded is decided at the first open: the simulator's fake libusb (sim models given, or
SPECK_USB_SIM=1), else a system libusb-1.0, else the library shipped by the libusb-package wheel (SPECK_LIBUSB_PATH
overrides). python-libusb1 binds one libusb per process, so asking for the other kind later raises
UsbLibraryConflict. The library is loaded before python-libusb1 is first used, which is what lets usb1 work
without a system libusb.

Resources die in order (CONVENTIONS.md item 13): the async pool's finalizer holds the device handle and the
context, the handle's finalizer holds the context, and close() tears down transfers, then interface and handle,
then the context.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from speck.usbgpu import errors, helper
from speck.usbgpu.devlock import DeviceLock
from speck.usbgpu.errors import UsbGpuValueError
from speck.usbgpu.settings import LIBUSB_PATH, USB_SIM
from speck.usbgpu.sim.model_api import UsbDeviceModel

__all__ = [
    "SUPPORTED_IDS",
    "PRODUCT_PREFIXES",
    "TransportStats",
    "UsbTransport",
    "loaded_libusb",
]

# PROTOCOL.md 1.1: both vendor ids run the custom firmware; both lists are searched, in this order.
SUPPORTED_IDS: tuple[tuple[int, int], ...] = ((0xADD1, 0x0001), (0x3801, 0x0001))
PRODUCT_PREFIXES: tuple[str, ...] = ("custom", "AS2462")
INTERFACE = 0
CONFIGURATION = 1
ALT_SETTING = 0
REQUEST_TYPE_VENDOR_OUT = 0x40
REQUEST_TYPE_VENDOR_IN = 0xC0
SIM_HINT = (
    "is the bridge connected and its custom firmware flashed (product string 'custom...')? "
    "To run without hardware set SPECK_USB_SIM=1 (SPECK_USB_SIM=<n> for n bridges) or pass sim=[model] to use the "
    "simulator."
)

LibusbKind = Literal["real", "sim"]
_loaded: tuple[LibusbKind, str] | None = None

T = TypeVar("T")


@dataclass
class TransportStats:
    """Per-transport counters (for the benchmark: control transfers per MB, bytes moved)."""

    control_transfers: int = 0
    control_in_bytes: int = 0
    control_out_bytes: int = 0
    bulk_out_transfers: int = 0
    bulk_out_bytes: int = 0
    bulk_in_transfers: int = 0
    bulk_in_bytes: int = 0
    async_submits: int = 0
    async_waits: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        for f in fields(self):
            setattr(self, f.name, 0)

    def snapshot(self) -> dict[str, int]:
        """The counters as a dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def loaded_libusb() -> tuple[LibusbKind, str] | None:
    """("real" | "sim", path) of the libusb this process loaded, or None before the first open."""
    return _loaded


def _real_libusb_path() -> str:
    """A system libusb-1.0 if one is installed, else the one bundled with the libusb-package wheel."""
    override = LIBUSB_PATH.value
    if override:
        return override
    system = ctypes.util.find_library("usb-1.0")
    if system:
        return system
    try:
        import libusb_package

        bundled = libusb_package.get_library_path()
    except ImportError:
        bundled = None
    if bundled is None:
        raise errors.LibusbLoadError(
            "find libusb-1.0",
            "no system libusb-1.0 and the libusb-package wheel has no library for this platform",
            "install libusb-1.0 (e.g. apt-get install libusb-1.0-0) or `pip install libusb-package`; "
            "set SPECK_USB_SIM=1 to use the simulator instead",
        )
    return str(bundled)


def _load_libusb(kind: LibusbKind, path: str) -> None:
    """Load libusb `path` into python-libusb1 and the helper, once per process."""
    global _loaded
    if _loaded is not None:
        if _loaded == (kind, path):
            return
        raise errors.UsbLibraryConflict(
            f"load the {kind} libusb ({path})",
            f"this process already uses the {_loaded[0]} libusb ({_loaded[1]})",
            "python-libusb1 binds one libusb per process: run simulator and hardware sessions in separate processes",
        )
    from usb1 import _libusb1

    try:
        dll = ctypes.CDLL(path, use_errno=True, use_last_error=True)
    except OSError as exc:
        raise errors.LibusbLoadError(f"load the {kind} libusb", str(exc)) from exc
    if not _libusb1.loadLibrary(dll):
        already = getattr(getattr(_libusb1, "libusb", None), "_name", "?")
        if already != path:
            raise errors.UsbLibraryConflict(
                f"load the {kind} libusb ({path})",
                f"python-libusb1 already loaded {already}",
                "open speck.usbgpu before anything else uses usb1 in this process",
            )
    helper.load_libusb(path)
    _loaded = (kind, path)


def sim_from_env() -> int:
    """How many simulated bridges SPECK_USB_SIM asks for: 0 when unset/"0", n for "n", 1 for any other value."""
    value = USB_SIM.value.strip()
    if value in ("", "0"):
        return 0
    return int(value) if value.isdigit() else 1


def _default_sim_models(count: int) -> list[UsbDeviceModel]:
    try:
        from speck.usbgpu.sim.device import default_devices  # type: ignore[attr-defined,unused-ignore]
    except ImportError as exc:
        raise errors.LibusbLoadError(
            "SPECK_USB_SIM",
            f"the default simulated devices (speck.usbgpu.sim.device.default_devices) are unavailable ({exc})",
            "pass sim=[model] with a UsbDeviceModel instead",
        ) from exc
    return list(default_devices(count))


def _raw_pointer(obj: Any) -> int:
    """The address held by a ctypes pointer (usb1's context / device handle)."""
    value = ctypes.cast(obj, ctypes.c_void_p).value
    return int(value or 0)


def _teardown(
    pool: helper.AsyncBulkPool | None, handle: Any, context: Any, claimed: list[bool], lock: DeviceLock | None
) -> None:
    """Free in dependency order: transfers, then interface + handle, then context; then let the next session in."""
    import usb1

    try:
        if pool is not None:
            pool.close()
    finally:
        try:
            if claimed and claimed[0]:
                claimed[0] = False
                try:
                    handle.releaseInterface(INTERFACE)
                except usb1.USBError:
                    pass  # a disconnected device cannot release; closing the handle still frees it
            handle.close()
        finally:
            try:
                context.close()
            finally:
                if lock is not None:
                    lock.release()


class UsbTransport:
    """An open bridge: sync control/bulk transfers and async bulk OUT, with named errors (speck.usbgpu.errors)."""

    product: str
    vid: int
    pid: int
    name: str
    stats: TransportStats

    def __init__(
        self,
        context: Any,
        handle: Any,
        product: str,
        vid: int,
        pid: int,
        name: str,
        simulated: bool,
        lock: DeviceLock | None = None,
    ) -> None:
        """Use UsbTransport.open(); this wraps an already configured usb1 context and handle (and the device lock
        taken for it, released on close)."""
        self.product, self.vid, self.pid, self.name = product, vid, pid, name
        self.simulated = simulated
        self.stats = TransportStats()
        self._context = context
        self._handle = handle
        from usb1 import _libusb1

        try:
            self._handle_p = handle._USBDeviceHandle__handle
            context_p = context._USBContext__context_p
        except AttributeError as exc:  # pragma: no cover - only with an incompatible python-libusb1
            raise errors.LibusbLoadError(
                "reach libusb handles through python-libusb1",
                f"this python-libusb1 has a different internal layout ({exc})",
                "install libusb1 3.x (pip install 'libusb1>=3,<4')",
            ) from exc
        self._handle_ptr = _raw_pointer(self._handle_p)
        self._libusb_control = _libusb1.libusb_control_transfer
        self._libusb_bulk = _libusb1.libusb_bulk_transfer
        self._pool = helper.AsyncBulkPool(_raw_pointer(context_p), self._handle_ptr, owners=(handle, context))
        self._claimed = [True]
        self._closed = False
        self._finalizer = weakref.finalize(self, _teardown, self._pool, handle, context, self._claimed, lock)
        self._bus_generation = _sim_generation() if simulated else 0

    # ---- opening ----
    @classmethod
    def open(
        cls,
        index: int = 0,
        sim: Sequence[UsbDeviceModel] | UsbDeviceModel | None = None,
        *,
        hardware_only: bool = False,
    ) -> UsbTransport:
        """Open the `index`-th usable bridge (VID:PID in SUPPORTED_IDS, product string 'custom...'/'AS2462...').

        With `sim` (models, or env SPECK_USB_SIM=<n> for the process's n default SimDevices) the simulator's fake
        libusb is loaded instead of the real one; passing the same model objects again reopens them as they are
        (their state kept), other models replace the simulated bus (transports still open on it see NO_DEVICE).
        `hardware_only` ignores SPECK_USB_SIM. A device already open (in this process or another) raises
        DeviceInUseError before anything is sent to it.

        Open sequence (PROTOCOL.md 1.2): read the product string; if a kernel driver holds interface 0,
        detach it and reset the device; set configuration 1; claim interface 0; select alt setting 0.
        """
        if index < 0:
            raise UsbGpuValueError(f"device index must be >= 0, got {index}")
        if sim is None and not hardware_only and sim_from_env():
            sim = _default_sim_models(sim_from_env())
        if sim is not None:
            from speck.usbgpu.sim import shim

            models: list[UsbDeviceModel] = [sim] if isinstance(sim, UsbDeviceModel) else list(sim)
            path = shim.library_path()
            _load_libusb("sim", path)  # check the conflict before touching the fake bus
            installed = shim.installed_models()
            if len(installed) != len(models) or any(a is not b for a, b in zip(installed, models)):
                shim.install(models)  # new models replace the bus; the same models are reopened as they are
            return cls._open_on_bus(index, simulated=True)
        _load_libusb("real", _real_libusb_path())
        return cls._open_on_bus(index, simulated=False)

    @classmethod
    def _open_on_bus(cls, index: int, simulated: bool) -> UsbTransport:
        import usb1

        context = usb1.USBContext()
        try:
            _call(simulated, "create libusb context", context.open)
            found, tried = cls._discover(context, simulated)
            if index >= len(found):
                for _, h, _, _ in found:
                    h.close()
                where = "simulated bus" if simulated else "USB bus"
                if found:
                    tried.append(f"only {len(found)} usable device(s) found, but index {index} was requested")
                raise errors.UsbDeviceNotFound(f"open USB GPU bridge #{index} on the {where}", tried, SIM_HINT)
            for i, (_, h, _, _) in enumerate(found):
                if i != index:
                    h.close()
            device, handle, product, name = found[index]
            lock = DeviceLock.acquire(cls._identity(device, handle, simulated), name)
            try:
                handle = cls._configure(device, handle, simulated, name)
                vid, pid = device.getVendorID(), device.getProductID()
                return cls(context, handle, product, vid, pid, name, simulated=simulated, lock=lock)
            except BaseException:
                lock.release()
                raise
        except BaseException:
            context.close()  # closes every handle and device opened on it
            raise

    @staticmethod
    def _identity(device: Any, handle: Any, simulated: bool) -> str:
        """What the device lock is keyed on: VID:PID + serial for a simulated device, bus + port path on hardware."""
        import usb1

        ids = f"{device.getVendorID():04x}-{device.getProductID():04x}"
        if simulated:
            try:
                serial = handle.getSerialNumber() or "none"
            except usb1.USBError:
                serial = "none"
            return f"sim-{ids}-{serial}"
        try:
            ports = ".".join(str(p) for p in device.getPortNumberList())
        except (usb1.USBError, AttributeError, NotImplementedError):
            ports = f"addr{device.getDeviceAddress()}"  # no port path from this libusb: the address stands in
        return f"usb-{device.getBusNumber()}-{ports}"

    @staticmethod
    def _discover(context: Any, simulated: bool) -> tuple[list[tuple[Any, Any, str, str]], list[str]]:
        """All usable bridges, in SUPPORTED_IDS order, and a line per candidate saying why it was (not) usable."""
        import usb1

        devices = _call(simulated, "enumerate USB devices", lambda: list(context.getDeviceIterator(skip_on_error=True)))
        found: list[tuple[Any, Any, str, str]] = []
        tried: list[str] = []
        for vid, pid in SUPPORTED_IDS:
            ident = f"{vid:04x}:{pid:04x}"
            matches = [d for d in devices if (d.getVendorID(), d.getProductID()) == (vid, pid)]
            if not matches:
                tried.append(f"{ident}: no device with this VID:PID")
            for d in matches:
                name = f"usb:{d.getBusNumber()}-{d.getDeviceAddress()}"
                try:
                    h = d.open()
                except usb1.USBError as exc:
                    tried.append(f"{ident} at {name}: open failed: {_describe(exc)}")
                    continue
                try:
                    product = h.getProduct() or ""
                except usb1.USBError as exc:
                    h.close()
                    tried.append(f"{ident} at {name}: reading the product string failed: {_describe(exc)}")
                    continue
                if not product.startswith(PRODUCT_PREFIXES):
                    h.close()
                    tried.append(
                        f"{ident} at {name}: product string {product!r} does not start with 'custom' or 'AS2462' "
                        "(stock firmware? flash the custom firmware)"
                    )
                    continue
                tried.append(f"{ident} at {name}: usable ({product!r})")
                found.append((d, h, product, name))
        return found, tried

    @staticmethod
    def _configure(device: Any, handle: Any, simulated: bool, name: str) -> Any:
        import usb1

        try:
            active = handle.kernelDriverActive(INTERFACE)
        except usb1.USBErrorNotSupported:
            active = False
        except usb1.USBError as exc:
            raise _convert(exc, f"query kernel driver on {name} interface {INTERFACE}", simulated) from exc
        if active:
            _call(simulated, f"detach kernel driver from {name} interface {INTERFACE}", handle.detachKernelDriver, 0)
            try:
                handle.resetDevice()
            except usb1.USBErrorNotFound:
                # libusb reports NOT_FOUND when the reset re-enumerated the device: open it again
                handle.close()
                handle = _call(simulated, f"reopen {name} after reset", device.open)
            except usb1.USBError as exc:
                raise _convert(exc, f"reset {name}", simulated) from exc
        _call(simulated, f"set configuration {CONFIGURATION} on {name}", handle.setConfiguration, CONFIGURATION)
        _call(simulated, f"claim interface {INTERFACE} of {name}", handle.claimInterface, INTERFACE)
        _call(
            simulated,
            f"select alt setting {ALT_SETTING} of {name} interface {INTERFACE}",
            handle.setInterfaceAltSetting,
            INTERFACE,
            ALT_SETTING,
        )
        return handle

    # ---- transfers ----
    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise errors.UsbClosedError(operation, f"the transport to {self.name} is closed")

    # The four sync transfers call python-libusb1's ctypes bindings of libusb directly on the same handle: they
    # are the driver's hot path, and usb1's convenience wrappers (buffer copies, exception translation we redo
    # anyway) cost more than the transfer's own host work. Operation strings are only built on errors.
    def control_in(self, request: int, value: int, index: int, length: int, timeout_ms: int = 1000) -> bytes:
        """Vendor control IN (bmRequestType 0xC0); returns exactly `length` bytes (a short reply is an error)."""
        if self._closed:
            self._check_open(_control_op("IN", request, value, index, length))
        buf = ctypes.create_string_buffer(length)
        rc = self._libusb_control(
            self._handle_p, REQUEST_TYPE_VENDOR_IN, request, value, index, buf, length, timeout_ms
        )
        if rc < 0:
            raise self._error(rc, _control_op("IN", request, value, index, length))
        if self.simulated:
            _deliver()
        self.stats.control_transfers += 1
        self.stats.control_in_bytes += rc
        if rc != length:
            raise errors.TransferShortError(
                _control_op("IN", request, value, index, length), None, f"{rc}/{length} bytes returned"
            )
        return buf.raw[:rc]

    def control_out(self, request: int, value: int, index: int, data: bytes = b"", timeout_ms: int = 1000) -> None:
        """Vendor control OUT (bmRequestType 0x40) with an optional data stage; a short write is an error."""
        length = len(data)
        if self._closed:
            self._check_open(_control_op("OUT", request, value, index, length))
        rc = self._libusb_control(
            self._handle_p, REQUEST_TYPE_VENDOR_OUT, request, value, index, bytes(data), length, timeout_ms
        )
        if rc < 0:
            raise self._error(rc, _control_op("OUT", request, value, index, length))
        if self.simulated:
            _deliver()
        self.stats.control_transfers += 1
        self.stats.control_out_bytes += rc
        if rc != length:
            raise errors.TransferShortError(
                _control_op("OUT", request, value, index, length), None, f"{rc}/{length} bytes accepted"
            )

    def bulk_out(self, endpoint: int, data: bytes | bytearray | memoryview, timeout_ms: int = 1000) -> None:
        """Synchronous bulk OUT; a short write is an error (PROTOCOL.md 4.6). `data` is not copied."""
        if self._closed:
            self._check_open(f"bulk OUT 0x{endpoint:02x}")
        sent = ctypes.c_int()
        if isinstance(data, bytes):
            nbytes = len(data)
            rc = self._libusb_bulk(self._handle_p, endpoint, data, nbytes, ctypes.byref(sent), timeout_ms)
        else:
            with helper.ffi.from_buffer("unsigned char[]", data) as cbuf:  # released on every path
                nbytes = len(cbuf)
                address = int(helper.ffi.cast("uintptr_t", cbuf))
                rc = self._libusb_bulk(self._handle_p, endpoint, address, nbytes, ctypes.byref(sent), timeout_ms)
        if rc < 0:
            raise self._error(rc, f"bulk OUT 0x{endpoint:02x} ({nbytes} bytes)", f"{sent.value}/{nbytes} bytes sent")
        if self.simulated:
            _deliver()
        self.stats.bulk_out_transfers += 1
        self.stats.bulk_out_bytes += sent.value
        if sent.value != nbytes:
            raise errors.TransferShortError(
                f"bulk OUT 0x{endpoint:02x} ({nbytes} bytes)",
                None,
                f"bulk OUT short write: {sent.value}/{nbytes} bytes",
            )

    def bulk_in(self, endpoint: int, length: int, timeout_ms: int = 10000) -> bytes:
        """Synchronous bulk IN of up to `length` bytes; returns what arrived."""
        if self._closed:
            self._check_open(f"bulk IN 0x{endpoint:02x} ({length} bytes)")
        buf = ctypes.create_string_buffer(length)
        got = ctypes.c_int()
        rc = self._libusb_bulk(self._handle_p, endpoint | 0x80, buf, length, ctypes.byref(got), timeout_ms)
        if rc < 0:
            raise self._error(rc, f"bulk IN 0x{endpoint:02x} ({length} bytes)", f"{got.value}/{length} bytes received")
        if self.simulated:
            _deliver()
        self.stats.bulk_in_transfers += 1
        self.stats.bulk_in_bytes += got.value
        return buf.raw[: got.value]

    def _error(self, rc: int, operation: str, detail: str = "") -> BaseException:
        """The exception for libusb return code `rc` (in the simulator, a model's own exception comes first)."""
        detail = "; ".join(d for d in (detail, self._unplugged_by_replacement()) if d)
        converted = errors.error_for_code(rc, operation, helper.libusb_text(rc) or None, detail)
        _reraise_model_exception(self.simulated, converted)
        return converted

    def _unplugged_by_replacement(self) -> str:
        """Why a simulated device answers NO_DEVICE when nothing disconnected it: another open put other models on
        the fake bus (UsbTransport.open with different models), which unplugs every handle of the old bus."""
        if not self.simulated or _sim_generation() == self._bus_generation:
            return ""
        return (
            f"the simulated bus {self.name} was on was replaced by an open of other device models in this process "
            "(e.g. UsbGpu.open(sim=True) while this session was open); open the same models again, or use "
            "SPECK_USB_SIM's shared devices for every session"
        )

    def clear_halt(self, endpoint: int) -> None:
        """CLEAR_FEATURE(ENDPOINT_HALT) on `endpoint`; the firmware also resets that endpoint and cancels streaming
        (PROTOCOL.md 1.4)."""
        operation = f"clear halt on endpoint 0x{endpoint:02x}"
        self._check_open(operation)
        _call(self.simulated, operation, self._handle.clearHalt, endpoint)
        self.stats.control_transfers += 1

    def submit_bulk_out(self, endpoint: int, data: bytes | bytearray | memoryview, timeout_ms: int = 10000) -> int:
        """Asynchronous bulk OUT through the C helper; returns a tag for wait(). `data` is not copied and stays
        referenced (a bytearray stays locked against resizing) until its tag completes."""
        if self._closed:
            self._check_open(f"submit async bulk OUT 0x{endpoint:02x}")
        try:
            tag = self._pool.submit(endpoint, data, timeout_ms)
        except errors.UsbError as exc:
            _reraise_model_exception(self.simulated, exc)
            if why := self._unplugged_by_replacement():
                exc.add_note(why)
            raise
        if self.simulated:
            _deliver()
        stats = self.stats
        stats.async_submits += 1
        stats.bulk_out_transfers += 1
        stats.bulk_out_bytes += data.nbytes if isinstance(data, memoryview) else len(data)
        return tag

    def wait(self, tag: int, timeout_ms: int = 10000) -> None:
        """Wait for async tag `tag`; raises the latched error (sticky) if any async transfer failed or was short."""
        if self._closed:
            self._check_open(f"wait for async bulk OUT tag {tag}")
        self.stats.async_waits += 1
        try:
            self._pool.wait(tag, timeout_ms)
        except errors.UsbError as exc:
            _reraise_model_exception(self.simulated, exc)
            if why := self._unplugged_by_replacement():
                exc.add_note(why)
            raise
        if self.simulated:
            _deliver()

    def is_done(self, tag: int) -> bool:
        """Whether async tag `tag` has completed (without waiting or raising the latch)."""
        return self._pool.is_done(tag)

    @property
    def inflight(self) -> int:
        """Async transfers submitted and not completed."""
        return self._pool.inflight

    # ---- closing ----
    def close(self) -> None:
        """Cancel in-flight async transfers, release the interface, close the handle and the context."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether close() ran."""
        return self._closed

    def __enter__(self) -> UsbTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        kind = "sim" if self.simulated else "usb"
        return f"<UsbTransport {self.name} {self.vid:04x}:{self.pid:04x} {self.product!r} {kind} {state}>"


def _control_op(direction: str, request: int, value: int, index: int, length: int) -> str:
    return f"control {direction} 0x{request:02X} (wValue=0x{value:04x}, wIndex=0x{index:04x}, {length} bytes)"


def _describe(exc: Any) -> str:
    """A usb1.USBError as "LIBUSB_ERROR_X (libusb's message); what to do"."""
    code = getattr(exc, "value", None)
    if not isinstance(code, int):
        return str(exc)
    err = errors.error_for_code(code, "")
    return f"{err.libusb_name} ({err.libusb_message})" + (f"; {err.hint}" if err.hint else "")


def _deliver() -> None:
    """In the simulator: raise what the models' callbacks caught during the call that just returned."""
    from speck.usbgpu.sim import shim

    shim.deliver()


def _sim_generation() -> int:
    from speck.usbgpu.sim import shim

    return shim.generation()


def _reraise_model_exception(simulated: bool, cause: BaseException) -> None:
    """In the simulator, an interrupt that landed in a model (Ctrl-C) is raised as itself; an exception the model
    raised (not a ModelError) is the real cause of the failed call: raise it."""
    if not simulated:
        return
    from speck.usbgpu.sim import shim

    interrupt = shim.take_interrupt()
    if interrupt is not None:
        raise interrupt from None
    model_exc = shim.take_exception()
    if model_exc is not None:
        raise model_exc from cause


def _convert(exc: Any, operation: str, simulated: bool) -> errors.UsbError:
    code = getattr(exc, "value", None)
    converted = errors.error_for_code(
        code if isinstance(code, int) else -99, operation, helper.libusb_text(code or -99)
    )
    _reraise_model_exception(simulated, converted)
    return converted


def _call(simulated: bool, operation: str, fn: Callable[..., T], *args: Any) -> T:
    """Run a usb1 call, turning usb1.USBError into the named speck.usbgpu.errors exception."""
    import usb1

    try:
        return fn(*args)
    except usb1.USBError as exc:
        raise _convert(exc, operation, simulated) from exc
