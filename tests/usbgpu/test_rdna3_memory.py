"""FlatMemory, the emulator's test memory: lane-vectorized gathers and scatters of any size and alignment, across
several mappings, agree with a byte-by-byte model; an access that leaves its mapping faults with the address and
the nearest mapping, and nothing is written."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from speck.usbgpu.errors import ShaderMemoryFault
from speck.usbgpu.sim.rdna3 import FlatMemory


@st.composite
def layouts(draw: st.DrawFn) -> tuple[FlatMemory, dict[int, int], list[tuple[int, int]]]:
    """A FlatMemory with 1-4 mappings of random sizes (filled with random bytes) and a byte model of it."""
    mem = FlatMemory(guard=draw(st.sampled_from([16, 4096])))
    model: dict[int, int] = {}
    spans = []
    for k in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 97))
        data = bytes(draw(st.lists(st.integers(0, 255), min_size=size, max_size=size)))
        addr = mem.alloc(data, f"r{k}", align=draw(st.sampled_from([1, 4, 256])))
        model.update({addr + i: b for i, b in enumerate(data)})
        spans.append((addr, size))
    return mem, model, spans


@settings(max_examples=80, deadline=None)
@given(layouts(), st.data())
def test_gather_and_scatter_agree_with_a_byte_model(layout: tuple, data: st.DataObject) -> None:
    mem, model, spans = layout
    size = data.draw(st.sampled_from([1, 2, 4, 8, 12, 16]))
    fits = [(a, n) for a, n in spans if n >= size]
    assume(fits)
    lanes = data.draw(st.integers(1, 40))
    addrs = []
    for _ in range(lanes):
        a, n = data.draw(st.sampled_from(fits))
        addrs.append(a + data.draw(st.integers(0, n - size)))
    got = mem.gather(np.array(addrs, dtype=np.uint64), size)
    assert got.tolist() == [[model[a + i] for i in range(size)] for a in addrs]
    new = np.array(data.draw(st.lists(st.integers(0, 255), min_size=lanes * size, max_size=lanes * size)), np.uint8)
    mem.scatter(np.array(addrs, dtype=np.uint64), new.reshape(lanes, size))
    for lane, a in enumerate(addrs):  # in lane order: a later lane wins an overlap
        for i in range(size):
            model[a + i] = int(new[lane * size + i])
    for a, n in spans:
        assert mem.read(a, n) == bytes(model[a + i] for i in range(n))


def test_an_access_leaving_its_mapping_faults_and_writes_nothing() -> None:
    mem = FlatMemory()
    a = mem.alloc(np.zeros(4, np.uint32), "buf")
    with pytest.raises(ShaderMemoryFault) as e:
        mem.scatter(np.array([a, a + 14], dtype=np.uint64), np.ones((2, 4), np.uint8))
    assert e.value.address == a + 14 and "buf" in e.value.region
    assert mem.read(a, 16) == bytes(16)
    with pytest.raises(ShaderMemoryFault, match="nearest mapping: buf"):
        mem.gather(np.array([a - 8], dtype=np.uint64), 4)
