"""Devices for tensors: the registry (speck.hcq's `Device`), buffers, name canonicalisation and which dtypes a
device computes with."""

from __future__ import annotations

from speck.hcq import Buffer, Device
from speck.uop import DType


def default_device() -> str:
    """The device new tensors live on (Device.DEFAULT; the DEV setting picks another)."""
    return str(Device.DEFAULT)


def canonical(device: str | None) -> str:
    """Canonical device name ('cpu' -> 'CPU'); None means the default device."""
    if device is None:
        return default_device()
    return str(Device.canonicalize(device))


def is_dtype_supported(dtype: DType, device: str | None = None) -> bool:
    """Whether tensors of `dtype` can be computed on `device` (default: the default device)."""
    dev = Device[canonical(device)]
    if not dev.backend_name:  # storage-only devices (DISK) hold any dtype and compute none
        return False
    return dtype.scalar() in dev.renderer.supported_dtypes()


__all__ = ["Buffer", "Device", "canonical", "default_device", "is_dtype_supported"]
