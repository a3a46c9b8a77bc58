"""speck.usbgpu: move data into and out of the VRAM of a GPU behind an ASM2464-class USB-to-PCIe bridge."""

from __future__ import annotations

from typing import Any

from speck.usbgpu._version import __version__

# Lazy exports keep `import speck.usbgpu` free of libusb loading (which library gets loaded is decided at open time).
_LAZY = {
    "UsbTransport": "speck.usbgpu.transport",
    "TransportStats": "speck.usbgpu.transport",
    "UsbGpu": "speck.usbgpu.api",
    "VramBuffer": "speck.usbgpu.api",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'speck.usbgpu' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
