"""Device names for tensors: the default device and name canonicalisation, delegated to speck.hcq's registry."""

from __future__ import annotations

from speck.hcq import Device


def default_device() -> str:
    """The device new tensors live on (Device.DEFAULT; the DEV environment variable picks another)."""
    return str(Device.DEFAULT)


def canonical(device: str | None) -> str:
    """Canonical device name ('cpu' -> 'CPU'); None means the default device."""
    if device is None:
        return default_device()
    return str(Device.canonicalize(device))


__all__ = ["Device", "canonical", "default_device"]
