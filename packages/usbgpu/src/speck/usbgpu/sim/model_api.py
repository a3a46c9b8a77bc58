"""The interface between the fake libusb (c_helpers/fake_libusb.c + speck.usbgpu.sim.shim) and a USB device model.

The fake libusb forwards every libusb call that reaches a device to an object implementing `UsbDeviceModel`:
synchronous libusb_control_transfer / libusb_bulk_transfer become `submit` + `wait([that id])`, asynchronous
libusb_submit_transfer becomes `submit`, and libusb_handle_events_timeout_completed becomes `wait(None, timeout)`
followed by the C completion callbacks of whatever completed. All timing lives in the model's virtual clock.

Conventions the fake libusb adds (speck.usbgpu.sim.shim): once `connected` is False, submit/wait are not called
any more (the transfers still in flight end with NO_DEVICE); an exception other than ModelError raised by a model
method is re-raised by the transport call that triggered it (so a detected protocol violation fails the test);
`shim.model_seconds()` is the CPU time spent inside model methods, for benchmarks that report the driver's own
cost; `shim.counters()` reports live transfers, handles and contexts for leak checks.

This module is the contract between the two halves of speck.usbgpu's simulator; changes are additive only.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "LIBUSB_SPEED_HIGH",
    "LIBUSB_SPEED_SUPER",
    "LIBUSB_SPEED_SUPER_PLUS",
    "AltSettingDescriptor",
    "ConfigurationDescriptor",
    "DeviceDescriptors",
    "EndpointDescriptor",
    "InterfaceDescriptor",
    "ModelError",
    "ModelSubmitError",
    "TransferKind",
    "TransferResult",
    "TransferStatus",
    "UsbDeviceModel",
    "asm2464_descriptors",
]

# libusb_speed values (what libusb_get_device_speed returns).
LIBUSB_SPEED_HIGH = 3
LIBUSB_SPEED_SUPER = 4
LIBUSB_SPEED_SUPER_PLUS = 5

TransferKind = Literal["control", "bulk"]


class TransferStatus(enum.IntEnum):
    """libusb_transfer_status: the outcome of one transfer (same numbering as libusb)."""

    COMPLETED = 0
    ERROR = 1
    TIMED_OUT = 2
    CANCELLED = 3
    STALL = 4
    NO_DEVICE = 5
    OVERFLOW = 6


@dataclass
class TransferResult:
    """How one submitted transfer ended: status, bytes moved (OUT: consumed, IN: len(data)) and IN data."""

    status: TransferStatus
    actual_length: int
    data: bytes = b""


@dataclass(frozen=True)
class EndpointDescriptor:
    """One endpoint descriptor (USB 2.0 table 9-13), plus the SuperSpeed companion's bMaxBurst/streams."""

    bEndpointAddress: int
    bmAttributes: int  # 2 = bulk
    wMaxPacketSize: int
    bInterval: int = 0
    max_burst: int = 0  # SS endpoint companion bMaxBurst (0 = 1 packet)
    max_streams_log2: int = 0  # SS companion bmAttributes bits 4:0 for bulk (0 = no streams)


@dataclass(frozen=True)
class AltSettingDescriptor:
    """One alternate setting of an interface (an interface descriptor with its endpoints)."""

    bAlternateSetting: int
    bInterfaceClass: int
    bInterfaceSubClass: int
    bInterfaceProtocol: int
    endpoints: tuple[EndpointDescriptor, ...]
    iInterface: int = 0


@dataclass(frozen=True)
class InterfaceDescriptor:
    """One interface with all its alternate settings."""

    bInterfaceNumber: int
    alt_settings: tuple[AltSettingDescriptor, ...]


@dataclass(frozen=True)
class ConfigurationDescriptor:
    """One configuration descriptor with its interfaces."""

    bConfigurationValue: int
    interfaces: tuple[InterfaceDescriptor, ...]
    bmAttributes: int = 0x80
    bMaxPower: int = 0x32  # units of 8 mA at SuperSpeed, 2 mA at high speed
    iConfiguration: int = 0


@dataclass(frozen=True)
class DeviceDescriptors:
    """Everything libusb can read about a device without a transfer: device descriptor fields and configurations.

    String descriptor indices refer to the model's `manufacturer`, `product` and `serial` (index 1, 2, 3 by default;
    0 means "no string"). `speed` is the libusb_speed the device enumerated at.
    """

    idVendor: int
    idProduct: int
    configurations: tuple[ConfigurationDescriptor, ...]
    bcdUSB: int = 0x0320
    bDeviceClass: int = 0
    bDeviceSubClass: int = 0
    bDeviceProtocol: int = 0
    bMaxPacketSize0: int = 9  # SuperSpeed: 2**9 = 512 bytes
    bcdDevice: int = 0x0001
    iManufacturer: int = 1
    iProduct: int = 2
    iSerialNumber: int = 3
    speed: int = LIBUSB_SPEED_SUPER_PLUS
    extra: dict[str, int] = field(default_factory=dict)  # room for additive fields without breaking the contract


class ModelError(Exception):
    """A model raises this from any method to make the corresponding synchronous libusb call return `code`.

    `code` is a negative libusb_error value (e.g. -4 LIBUSB_ERROR_NO_DEVICE, -9 LIBUSB_ERROR_PIPE).
    """

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"libusb error {self.code}" + (f": {self.message}" if self.message else "")


class ModelSubmitError(ModelError):
    """Raised by `UsbDeviceModel.submit` to make libusb_submit_transfer (or a sync transfer) fail with `code`."""


@runtime_checkable
class UsbDeviceModel(Protocol):
    """A simulated USB device as the fake libusb sees it (see the module docstring for the call mapping)."""

    vid: int
    pid: int
    bus: int
    address: int
    manufacturer: str
    product: str
    serial: str

    def descriptors(self) -> DeviceDescriptors:
        """Device/configuration/interface/endpoint descriptors (PROTOCOL.md 1.1/1.2)."""
        ...

    def kernel_driver_active(self, interface: int) -> bool:
        """Whether a (simulated) kernel driver is bound to `interface`."""
        ...

    def detach_kernel_driver(self, interface: int) -> None:
        """Unbind the kernel driver from `interface`."""
        ...

    def reset(self) -> None:
        """USB port reset."""
        ...

    def set_configuration(self, value: int) -> None:
        """SET_CONFIGURATION with the side effects of PROTOCOL.md 1.4."""
        ...

    def set_interface_alt_setting(self, interface: int, alt: int) -> None:
        """SET_INTERFACE with the side effects of PROTOCOL.md 1.4."""
        ...

    def clear_halt(self, endpoint: int) -> None:
        """CLEAR_FEATURE(ENDPOINT_HALT) on `endpoint`."""
        ...

    @property
    def connected(self) -> bool:
        """False after an injected disconnect: every later call fails with LIBUSB_ERROR_NO_DEVICE."""
        ...

    def submit(
        self,
        kind: TransferKind,
        endpoint: int,
        setup: bytes | None,
        out_data: bytes,
        in_length: int,
        timeout_ms: int,
    ) -> int:
        """Start a transfer and return its id; may raise ModelSubmitError(code).

        `setup` is the 8-byte little-endian setup packet for control transfers (None for bulk), `out_data` the OUT
        payload, `in_length` the IN length requested (0 for OUT transfers).
        """
        ...

    def cancel(self, transfer_id: int) -> None:
        """Request cancellation; the transfer later completes with CANCELLED (unless it already completed)."""
        ...

    def wait(self, transfer_ids: Sequence[int] | None, timeout_ms: int) -> list[tuple[int, TransferResult]]:
        """Advance virtual time until one of `transfer_ids` (None = any pending) completes or `timeout_ms` passes.

        timeout_ms=0 only collects what already completed. Returns every transfer that completed, in completion
        order; a transfer whose own timeout expires completes with TIMED_OUT.
        """
        ...


def asm2464_descriptors(vid: int, pid: int, superspeed: bool = True) -> DeviceDescriptors:
    """The descriptors of the ASM2464 bridge with the custom firmware (PROTOCOL.md 1.1/1.2), for models to use.

    Configuration 1, interface 0; alt setting 0 is the vendor-class pair 0x81 IN / 0x02 OUT used by the driver,
    alt setting 1 the unused UAS-shaped set of four stream-capable bulk endpoints.
    """
    mps = 1024 if superspeed else 512
    burst = 15 if superspeed else 0
    streams = 5 if superspeed else 0

    def bulk(addr: int, with_streams: bool) -> EndpointDescriptor:
        return EndpointDescriptor(addr, 2, mps, 0, burst, streams if with_streams else 0)

    alt0 = AltSettingDescriptor(0, 0xFF, 0xFF, 0xFF, (bulk(0x81, False), bulk(0x02, False)))
    alt1 = AltSettingDescriptor(1, 0x08, 0x06, 0x62, tuple(bulk(a, True) for a in (0x81, 0x02, 0x83, 0x04)))
    config = ConfigurationDescriptor(1, (InterfaceDescriptor(0, (alt0, alt1)),))
    return DeviceDescriptors(
        idVendor=vid,
        idProduct=pid,
        configurations=(config,),
        bcdUSB=0x0320 if superspeed else 0x0200,
        bMaxPacketSize0=9 if superspeed else 64,
        speed=LIBUSB_SPEED_SUPER_PLUS if superspeed else LIBUSB_SPEED_HIGH,
    )
