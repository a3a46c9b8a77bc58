"""speck.usbgpu.sim: a USB device model plugged in beneath the libusb API (see sim/model_api.py and sim/shim.py)."""

from speck.usbgpu.sim.config import HARDWARE_LIKE_SUBSYSTEM, SimFaults, SimTiming, TransferFault
from speck.usbgpu.sim.device import SimDevice, default_devices
from speck.usbgpu.sim.model_api import (
    DeviceDescriptors,
    ModelError,
    ModelSubmitError,
    TransferResult,
    TransferStatus,
    UsbDeviceModel,
)

__all__ = [
    "HARDWARE_LIKE_SUBSYSTEM",
    "SimDevice",
    "default_devices",
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
