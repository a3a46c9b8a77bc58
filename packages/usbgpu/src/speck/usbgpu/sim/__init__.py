"""speck.usbgpu.sim: a USB device model plugged in beneath the libusb API (see sim/model_api.py and sim/shim.py)."""

from speck.usbgpu.sim.config import SimFaults, SimTiming, TransferFault
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.model_api import (
    DeviceDescriptors,
    ModelError,
    ModelSubmitError,
    TransferResult,
    TransferStatus,
    UsbDeviceModel,
)

__all__ = [
    "SimDevice",
    "SimFaults",
    "SimTiming",
    "TransferFault",
    "DeviceDescriptors",
    "ModelError",
    "ModelSubmitError",
    "TransferResult",
    "TransferStatus",
    "UsbDeviceModel",
]
