"""speck.usbgpu's settings, the only code of the package that reads the environment at run time (the build script,
_build_helper.py, runs in the build backend before the package is importable and reads its own build knobs:
SPECK_C_HELPERS, CC, SPECK_USBGPU_CFLAGS). speck.usbgpu stands alone (it imports no other speck package), so its
table is its own, shaped like speck.uop.settings': each setting declared once with its default, the modules that read
it and what it does. All are read at each use: the simulator and the test harnesses set them as the process runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from speck.usbgpu.errors import UsbGpuUsageError


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    readers: tuple[str, ...]
    doc: str

    @property
    def value(self) -> str:
        """The environment's value, or the default when it is unset or empty."""
        return os.environ.get(self.name) or self.default

    @property
    def is_set(self) -> bool:
        return bool(os.environ.get(self.name))


TABLE: dict[str, Setting] = {}


def declare(name: str, default: str, readers: tuple[str, ...], doc: str) -> Setting:
    if name in TABLE:
        raise UsbGpuUsageError(f"setting {name!r} is declared twice; import it instead")
    s = TABLE[name] = Setting(name, default, readers, doc)
    return s


LOCK_DIR = declare("SPECK_USB_LOCK_DIR", "", ("speck.usbgpu.devlock",), "where device lock files go (default /tmp)")
COPYIN = declare("USB_COPYIN", "g3", ("speck.usbgpu.gpu",), "the copy-in mode: g3 or g0")
F4GATE = declare("USB_F4GATE", "1", ("speck.usbgpu.gpu",), "0: no F4 gate")
ZEROCOPY = declare("USB_ZEROCOPY", "1", ("speck.usbgpu.gpu",), "0: no zero-copy transfers")
UNVERIFIED = declare(
    "SPECK_USBGPU_UNVERIFIED", "0", ("speck.usbgpu.gpu",), "1: run the GPU bring-up steps not verified on hardware yet"
)
FIRMWARE = declare("SPECK_AMDGPU_FIRMWARE", "", ("speck.usbgpu.gpu",), "a directory of AMD GPU firmware files")
LIBUSB_PATH = declare("SPECK_LIBUSB_PATH", "", ("speck.usbgpu.transport",), "the libusb-1.0 library to load")
USB_SIM = declare("SPECK_USB_SIM", "", ("speck.usbgpu.transport",), "n: n simulated bridges instead of real ones")
