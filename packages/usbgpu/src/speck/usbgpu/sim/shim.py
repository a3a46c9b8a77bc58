"""Plug device models in beneath the libusb API: the fake libusb (speck.usbgpu._fakeusb) calls back into here.

`install(models)` registers the models as the devices of the fake libusb's bus and returns the path of the fake
library, which the transport then loads as "libusb" for python-libusb1 and the async helper. Each libusb call
that reaches a device arrives as a cffi callback below and is forwarded to the model per sim/model_api.py.

Exceptions: a model raising ModelError(code) makes the libusb call return `code`. Any other exception (a bug,
or a protocol violation the model detected) makes the call return LIBUSB_ERROR_OTHER and is kept here;
the transport re-raises it (take_exception) so it fails the test that caused it. A KeyboardInterrupt (Ctrl-C lands
in model code, since that is where a simulated transfer spends its time) or SystemExit also makes the call return
LIBUSB_ERROR_OTHER - so no C loop carries on as after an interrupted system call - and the transport raises it as
itself the moment the libusb call returns, whether the call failed or not (`deliver`): it never waits for a later,
unrelated error to surface.
"""

from __future__ import annotations

import importlib
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from speck.usbgpu.errors import UsbGpuValueError
from speck.usbgpu.sim.model_api import (
    LIBUSB_SPEED_SUPER,
    DeviceDescriptors,
    ModelError,
    UsbDeviceModel,
)

# The compiled fake libusb (cffi API mode); imported by name so type checkers treat it as the untyped module it is.
_fake: Any = importlib.import_module("speck.usbgpu._fakeusb")
ffi: Any = _fake.ffi
lib: Any = _fake.lib

__all__ = [
    "counters",
    "install",
    "generation",
    "installed_models",
    "library_path",
    "model_seconds",
    "reset_model_seconds",
    "deliver",
    "take_exception",
    "take_interrupt",
    "uninstall",
]

LIBUSB_ERROR_NO_DEVICE = -4
LIBUSB_ERROR_NOT_FOUND = -5
LIBUSB_ERROR_PIPE = -9
LIBUSB_ERROR_NOT_SUPPORTED = -12
LIBUSB_ERROR_OTHER = -99

_models: list[UsbDeviceModel] = []
_pending: list[BaseException] = []
_interrupts: list[BaseException] = []  # KeyboardInterrupt / SystemExit caught in a callback, not yet delivered
_ops = ffi.new("struct fakeusb_ops *")
# CPU seconds this thread spent inside model callbacks, so benchmarks can report the driver's own cost without the
# simulator's (thread CPU time, not wall time: other processes sharing the cores must not count).
_model_time = [0.0]
_generation = [0]  # bumped by every install/uninstall: a transport opened on an older bus was unplugged by it


def library_path() -> str:
    """Path of the fake libusb shared object (the compiled speck.usbgpu._fakeusb module)."""
    return str(_fake.__file__)


def device_descriptor_bytes(d: DeviceDescriptors) -> bytes:
    """The 18-byte wire-format device descriptor (USB 2.0 table 9-8)."""
    return struct.pack(
        "<BBHBBBBHHHBBBB",
        18,
        1,
        d.bcdUSB,
        d.bDeviceClass,
        d.bDeviceSubClass,
        d.bDeviceProtocol,
        d.bMaxPacketSize0,
        d.idVendor,
        d.idProduct,
        d.bcdDevice,
        d.iManufacturer,
        d.iProduct,
        d.iSerialNumber,
        len(d.configurations),
    )


def configuration_bytes(d: DeviceDescriptors) -> bytes:
    """All configuration descriptors in wire format (config, interface, endpoint and, at SuperSpeed, the endpoint
    companion descriptors), concatenated."""
    out = b""
    for config in d.configurations:
        body = b""
        for interface in config.interfaces:
            for alt in interface.alt_settings:
                body += struct.pack(
                    "<BBBBBBBBB",
                    9,
                    4,
                    interface.bInterfaceNumber,
                    alt.bAlternateSetting,
                    len(alt.endpoints),
                    alt.bInterfaceClass,
                    alt.bInterfaceSubClass,
                    alt.bInterfaceProtocol,
                    alt.iInterface,
                )
                for ep in alt.endpoints:
                    body += struct.pack(
                        "<BBBBHB", 7, 5, ep.bEndpointAddress, ep.bmAttributes, ep.wMaxPacketSize, ep.bInterval
                    )
                    if d.speed >= LIBUSB_SPEED_SUPER:
                        body += struct.pack("<BBBBH", 6, 0x30, ep.max_burst, ep.max_streams_log2, 0)
        header = struct.pack(
            "<BBHBBBBB",
            9,
            2,
            9 + len(body),
            len(config.interfaces),
            config.bConfigurationValue,
            config.iConfiguration,
            config.bmAttributes,
            config.bMaxPower,
        )
        out += header + body
    return out


def install(models: Sequence[UsbDeviceModel]) -> str:
    """Make `models` the devices on the fake libusb's bus (replacing any earlier installation) and return the
    path of the fake library to load. Handles opened on an earlier installation answer NO_DEVICE from now on."""
    global _models
    _ops.connected = ffi.addressof(lib, "fakeusb_py_connected")
    _ops.get_string = ffi.addressof(lib, "fakeusb_py_get_string")
    _ops.kernel_driver_active = ffi.addressof(lib, "fakeusb_py_kernel_driver_active")
    _ops.control_op = ffi.addressof(lib, "fakeusb_py_control_op")
    _ops.submit = ffi.addressof(lib, "fakeusb_py_submit")
    _ops.cancel = ffi.addressof(lib, "fakeusb_py_cancel")
    _ops.wait = ffi.addressof(lib, "fakeusb_py_wait")
    new_models = list(models)
    _generation[0] += 1
    lib.fakeusb_set_ops(_ops)
    _models = new_models
    _pending.clear()
    for i, model in enumerate(new_models):
        desc = model.descriptors()
        configs = configuration_bytes(desc)
        index = lib.fakeusb_add_device(
            model.bus, model.address, desc.speed, device_descriptor_bytes(desc), configs, len(configs)
        )
        if index != i:
            raise UsbGpuValueError(
                f"fake libusb rejected simulated device {i} ({model.vid:04x}:{model.pid:04x}): error {index}; "
                "its descriptors() must describe consistent configurations (at most 64 devices)"
            )
    return library_path()


def uninstall() -> None:
    """Remove every device from the fake bus (open handles answer NO_DEVICE)."""
    global _models
    lib.fakeusb_set_ops(ffi.NULL)
    _generation[0] += 1
    _models = []


def generation() -> int:
    """How many times the fake bus was (re)installed or emptied; a handle opened before the last change is dead."""
    return _generation[0]


def installed_models() -> list[UsbDeviceModel]:
    """The models currently on the fake bus, in device-index order."""
    return list(_models)


def take_exception() -> BaseException | None:
    """The first non-ModelError exception a model raised since the last call (then forgotten), or None."""
    if not _pending:
        return None
    exc = _pending[0]
    _pending.clear()
    return exc


def take_interrupt() -> BaseException | None:
    """A KeyboardInterrupt or SystemExit that landed in a model callback since the last call (then forgotten)."""
    if not _interrupts:
        return None
    exc = _interrupts[0]
    _interrupts.clear()
    return exc


def deliver() -> None:
    """Raise what a callback of the libusb call that just returned caught: an interrupt first (as itself), else a
    model's exception. The transport calls this after every call into the fake libusb."""
    if _interrupts:
        exc = take_interrupt()
        _pending.clear()  # whatever the interrupted model was in the middle of is moot
        assert exc is not None
        raise exc
    if _pending:
        model_exc = take_exception()
        assert model_exc is not None
        raise model_exc


def counters() -> dict[str, int]:
    """Fake-libusb resource counters, for leak and ordering checks in tests."""
    return {
        "inflight_transfers": lib.fakeusb_inflight_count(),
        "live_transfers": lib.fakeusb_live_transfers(),
        "open_handles": lib.fakeusb_open_handles(),
        "live_contexts": lib.fakeusb_live_contexts(),
        "null_context_event_calls": lib.fakeusb_null_context_event_calls(),
    }


def model_seconds() -> float:
    """CPU seconds spent inside the fake libusb's callbacks into device models since reset_model_seconds()."""
    return _model_time[0]


def reset_model_seconds() -> None:
    """Zero the model-time accumulator."""
    _model_time[0] = 0.0


def _timed(fn: Callable[..., int]) -> Callable[..., int]:
    clock = time.thread_time

    def timed(*args: Any) -> int:
        start = clock()
        try:
            return fn(*args)
        finally:
            _model_time[0] += clock() - start

    timed.__name__ = fn.__name__
    return timed


def _fail(exc: BaseException) -> int:
    if isinstance(exc, ModelError):
        return exc.code if exc.code < 0 else LIBUSB_ERROR_OTHER
    (_pending if isinstance(exc, Exception) else _interrupts).append(exc)
    return LIBUSB_ERROR_OTHER


def _escaped(exc_type: type[BaseException], exc: BaseException, traceback: object) -> int:
    """cffi's handler for an exception that escaped a callback's own handling (one landing in `_timed`'s
    bookkeeping): keep it like any other and fail the call."""
    return _fail(exc)


def _model(dev: int) -> UsbDeviceModel:
    return _models[dev]


def _py_connected(dev: int) -> int:
    try:
        return 1 if _model(dev).connected else 0
    except BaseException as exc:
        _fail(exc)
        return 0


def _py_get_string(dev: int, index: int, buf: object, length: int) -> int:
    try:
        model = _model(dev)
        desc = model.descriptors()
        strings = {
            desc.iManufacturer: model.manufacturer,
            desc.iProduct: model.product,
            desc.iSerialNumber: model.serial,
        }
        strings.pop(0, None)
        if index not in strings:
            return LIBUSB_ERROR_PIPE  # a real device stalls a request for a string it does not have
        data = strings[index].encode("ascii", errors="replace")[: max(length, 0)]
        ffi.memmove(buf, data, len(data))
        return len(data)
    except BaseException as exc:
        return _fail(exc)


def _py_kernel_driver_active(dev: int, interface_number: int) -> int:
    try:
        return 1 if _model(dev).kernel_driver_active(interface_number) else 0
    except BaseException as exc:
        return _fail(exc)


def _py_control_op(dev: int, op: int, a: int, b: int) -> int:
    try:
        model = _model(dev)
        if op == lib.FAKEUSB_OP_DETACH_KERNEL_DRIVER:
            model.detach_kernel_driver(a)
        elif op == lib.FAKEUSB_OP_RESET:
            model.reset()
        elif op == lib.FAKEUSB_OP_SET_CONFIGURATION:
            model.set_configuration(a)
        elif op == lib.FAKEUSB_OP_SET_ALT_SETTING:
            model.set_interface_alt_setting(a, b)
        elif op == lib.FAKEUSB_OP_CLEAR_HALT:
            model.clear_halt(a)
        else:  # attach_kernel_driver: device models have no kernel driver to rebind
            return LIBUSB_ERROR_NOT_SUPPORTED
        return 0
    except BaseException as exc:
        return _fail(exc)


def _py_submit(
    dev: int,
    kind: int,
    endpoint: int,
    setup: object,
    out_data: object,
    out_length: int,
    in_length: int,
    timeout_ms: int,
) -> int:
    try:
        setup_bytes = bytes(ffi.buffer(setup, 8)) if setup != ffi.NULL else None
        payload = bytes(ffi.buffer(out_data, out_length)) if out_length > 0 else b""
        model = _model(dev)
        if not model.connected:
            return LIBUSB_ERROR_NO_DEVICE
        kind_name: Literal["control", "bulk"] = "control" if kind == lib.FAKEUSB_KIND_CONTROL else "bulk"
        transfer_id = model.submit(kind_name, endpoint, setup_bytes, payload, in_length, timeout_ms)
        if transfer_id < 0:
            raise UsbGpuValueError(f"model.submit returned a negative transfer id {transfer_id}; ids must be >= 0")
        return transfer_id
    except BaseException as exc:
        return _fail(exc)


def _py_cancel(dev: int, transfer_id: int) -> int:
    try:
        model = _model(dev)
        if not model.connected:
            return LIBUSB_ERROR_NO_DEVICE
        model.cancel(transfer_id)
        return 0
    except BaseException as exc:
        return _fail(exc)


def _py_wait(dev: int, ids: object, n_ids: int, timeout_ms: int) -> int:
    try:
        model = _model(dev)
        if not model.connected:
            return LIBUSB_ERROR_NO_DEVICE
        wanted = None if n_ids < 0 else [ids[i] for i in range(n_ids)]  # type: ignore[index]
        completed = model.wait(wanted, timeout_ms)
        for transfer_id, result in completed:
            data = result.data
            if data:
                with ffi.from_buffer("unsigned char[]", data) as cdata:  # released at once, whatever happens
                    lib.fakeusb_complete(dev, transfer_id, int(result.status), result.actual_length, cdata, len(data))
            else:
                lib.fakeusb_complete(dev, transfer_id, int(result.status), result.actual_length, ffi.NULL, 0)
        return len(completed)
    except BaseException as exc:
        return _fail(exc)


# Bind the callbacks the fake libusb's operations table points at (cffi `extern "Python"` in fake_libusb.cdef).
for _name, _fn in (
    ("fakeusb_py_connected", _py_connected),
    ("fakeusb_py_get_string", _py_get_string),
    ("fakeusb_py_kernel_driver_active", _py_kernel_driver_active),
    ("fakeusb_py_control_op", _py_control_op),
    ("fakeusb_py_submit", _py_submit),
    ("fakeusb_py_cancel", _py_cancel),
    ("fakeusb_py_wait", _py_wait),
):
    ffi.def_extern(name=_name, onerror=_escaped)(_timed(_fn))
