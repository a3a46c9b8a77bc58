"""The compute API's arguments are checked when an operation is issued: a PM4 dword outside 32 bits was masked (the
GPU ran other packets than the caller wrote), a wait for a value never submitted timed out and left the queue taken
as hung, a NaN timeout never ended, and a dispatch of something that is no KernelCode raised AttributeError inside
the operation, which made the session unusable. Each case is now a named error and the session stays usable."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.usbgpu.amd import pm4
from speck.usbgpu.amd.compute import KernelCode
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import UsbGpuError


@pytest.fixture(scope="module")
def gpu() -> Iterator[UsbGpu]:
    g = UsbGpu.open(sim=True)
    yield g
    g.close()


def _still_usable(g: UsbGpu) -> None:
    buf = g.alloc(64)
    v = g.submit(pm4.write_data(buf.va, [0xC0FFEE]))
    g.wait(v)
    out = bytearray(4)
    g.copyout(out, buf)
    assert out == (0xC0FFEE).to_bytes(4, "little") and g.usable and not g.queue_status().faults
    g.free(buf)


@settings(max_examples=25)
@given(st.one_of(st.integers(-(2**70), -1), st.integers(2**32, 2**70)))
def test_a_packet_dword_outside_32_bits_is_refused(gpu: UsbGpu, bad: int) -> None:
    before = gpu.queue_status().submitted
    good = pm4.nop(1)
    with pytest.raises(ValueError, match=rf"dword {len(good)} is {bad}, outside .*0xFFFFFFFF") as ei:
        gpu.submit([*good, bad])
    assert isinstance(ei.value, UsbGpuError) and gpu.queue_status().submitted == before


@pytest.mark.parametrize("packets", [["a"], [1.0], [True], None, 5])
def test_packets_that_are_no_ints_are_a_type_error(gpu: UsbGpu, packets: Any) -> None:
    with pytest.raises(TypeError, match="submit"):
        gpu.submit(packets)
    _still_usable(gpu)


def test_waiting_for_a_value_never_submitted_is_refused_and_leaves_the_queue_healthy(gpu: UsbGpu) -> None:
    last = gpu.submit(pm4.nop(2))
    with pytest.raises(ValueError, match=rf"wait\({last + 5}\): only {last} compute submissions"):
        gpu.wait(last + 5, 0.01)
    _still_usable(gpu)


@pytest.mark.parametrize("timeout, err", [(math.nan, ValueError), (math.inf, ValueError), (-1.0, ValueError),
                                          ("1", TypeError), (None, TypeError)])  # fmt: skip
def test_a_wait_timeout_is_a_finite_number(gpu: UsbGpu, timeout: Any, err: type[Exception]) -> None:
    v = gpu.submit(pm4.nop(1))
    with pytest.raises(err, match="timeout"):
        gpu.wait(v, timeout)
    with pytest.raises(err, match="timeout"):
        gpu.dispatch(KernelCode(0, 0, 4), (1,), (1,), timeout=timeout)
    gpu.wait(v, 5.0)


@pytest.mark.parametrize(
    "code, grid, block, kernargs, err, match",
    [
        ("kernel", (1,), (1,), b"", TypeError, "KernelCode"),
        (None, (1,), (1,), b"", TypeError, "KernelCode"),
        ("k", (1, 1, 1, 4), (1,), b"", TypeError, "grid must be 1 to 3 ints"),
        ("k", (1.5,), (1,), b"", TypeError, "grid must be 1 to 3 ints"),
        ("k", 4, (1,), b"", TypeError, "grid must be a sequence"),
        ("k", (), (1,), b"", TypeError, "grid must be 1 to 3 ints"),
        ("k", (2**32,), (1,), b"", ValueError, "grid"),
        ("k", (0, 1), (1,), b"", ValueError, "grid"),
        ("k", (1,), (-1,), b"", ValueError, "block"),
        ("k", (1,), (1,), "args", TypeError, "kernargs must be bytes"),
        ("k", (1,), (1,), [1, 2], TypeError, "kernargs must be bytes"),
    ],
)
def test_dispatch_arguments_are_checked_before_the_device(
    gpu: UsbGpu, code: Any, grid: Any, block: Any, kernargs: Any, err: type[Exception], match: str
) -> None:
    code = KernelCode(0, 0, 4) if code == "k" else code
    for call in (gpu.dispatch, gpu.launch_packets):
        with pytest.raises(err, match=match) as ei:
            call(code, grid, block, kernargs)
        assert isinstance(ei.value, UsbGpuError)
    _still_usable(gpu)
