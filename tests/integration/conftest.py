"""Fixtures the USB:SIM integration tests share (a module asks for the bridges with
`pytestmark = pytest.mark.usefixtures("two_simulated_bridges")`): the process's simulated bridges, and the device."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from speck.tensor import Device
from speck.tensor.usb import UsbDevice

USB = "USB:SIM"  # under SPECK_USB_SIM (the bridges are shared by the process) it is USB


@pytest.fixture(scope="module")
def two_simulated_bridges() -> Iterator[None]:
    """SPECK_USB_SIM=2 for the module: two simulated bridges on the bus, USB (= USB:SIM) and USB:1."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECK_USB_SIM", "2")
        yield


@pytest.fixture(scope="module")
def dev() -> UsbDevice:
    """The simulated device, opened once for the module."""
    d = Device[USB]
    assert isinstance(d, UsbDevice) and d.gpu.sim is not None
    return d
