"""Shared setup for tests/usbgpu: no exception raised inside a simulated device may go unnoticed."""

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_swallowed_model_exceptions() -> Iterator[None]:
    """A model exception the fake libusb reported as LIBUSB_ERROR_OTHER must have been re-raised by the transport;
    one still pending after a test means some path dropped it."""
    from speck.usbgpu.sim import shim

    shim.take_exception()
    yield
    leftover = shim.take_exception()
    assert leftover is None, f"a simulated device raised {leftover!r} but no caller re-raised it"
