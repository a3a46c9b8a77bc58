"""A DEV setting naming no device is a DeviceNotFoundError that says it came from DEV (the unknown name alone left
the user looking for a device argument they never passed), listing the known devices."""

from __future__ import annotations

import pytest

from speck.hcq import Device
from speck.hcq.errors import DeviceNotFoundError
from speck.uop.helpers import Context


@pytest.mark.parametrize("dev", ["NOPE", "CPU:BAD", "NULL:x"])
def test_an_unknown_dev_names_the_setting(dev: str) -> None:
    with Context(DEV=dev), pytest.raises(DeviceNotFoundError) as ei:
        _ = Device.DEFAULT
    msg = str(ei.value)
    assert f"DEV={dev}".upper() in msg.upper() and "known devices" in msg and "CPU" in msg  # (DEV parts upper-cased)
    assert isinstance(ei.value, KeyError)
    assert Device.DEFAULT  # outside the Context: the default again
