"""The shader core's view of VRAM (sim/shader_memory.py): the one-translation fast path gives what translating lane
by distinct 4 KiB page gives, bit for bit, for accesses near and across page boundaries, and gather returns the bytes
a plain VM read returns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.shader_memory import ShaderMemory

PAGES = 4


@pytest.fixture(scope="module")
def mapped() -> Iterator[tuple[Any, ShaderMemory]]:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(PAGES << 12)
        gpu.copyin(buf, bytes(np.random.default_rng(0).integers(0, 256, PAGES << 12, dtype=np.uint8)))
        yield buf, ShaderMemory(dev.gpu, gpu.context.compute.layout.vmid)


@given(st.integers(0, (PAGES << 12) - 64), st.lists(st.integers(-4200, 4200), min_size=1, max_size=40),
       st.sampled_from([1, 2, 4, 8, 16]))  # fmt: skip
def test_fast_translation_matches_per_page_translation(mapped: Any, start: int, deltas: list[int], size: int) -> None:
    buf, memory = mapped
    offsets = [min(max(start + d, 0), (PAGES << 12) - size) for d in deltas]
    addresses = np.array([buf.va + o for o in offsets], dtype=np.uint64)
    fast, fast_system = memory._physical(addresses, size, write=False)
    slow, slow_system = memory._physical_pages(addresses, size, write=False)
    assert np.array_equal(fast, slow) and np.array_equal(fast_system, slow_system)
    got = memory.gather(addresses, size)
    for lane, address in enumerate(addresses.tolist()):
        assert bytes(got[lane]) == memory.read(address, size)
