"""speck.usbgpu.sim: a USB device model plugged in beneath the libusb API (see sim/model_api.py and sim/shim.py)."""

from speck.usbgpu.sim.model_api import (
    DeviceDescriptors,
    ModelError,
    ModelSubmitError,
    TransferResult,
    TransferStatus,
    UsbDeviceModel,
)

__all__ = [
    "DeviceDescriptors",
    "ModelError",
    "ModelSubmitError",
    "TransferResult",
    "TransferStatus",
    "UsbDeviceModel",
]
