"""Copy-in (G3, G0) and copy-out through the real transport, fake libusb and C helper, against the simulator."""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speck.usbgpu.amd.sdma import nop
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.copyin import CP_SIZE, CopyEngine
from speck.usbgpu.sim.config import SimFaults, SimTiming
from speck.usbgpu.sim.device import SimDevice

KIB = 1024
SIZES = [0, 1, 511, 512, 240 * KIB - 1, 240 * KIB, 240 * KIB + 1, 480 * KIB, 1024 * KIB + 7]


def payload(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


_SESSION: list[tuple[UsbGpu, SimDevice]] = []


@pytest.fixture(scope="module", autouse=True)
def _close_cached_session() -> Iterator[None]:
    """Close the shared session when the module is done (other modules count open handles)."""
    yield
    while _SESSION:
        _SESSION.pop()[0].close()


@pytest.fixture
def session() -> Iterator[tuple[UsbGpu, SimDevice]]:
    """One simulated session shared by the cheap round-trip tests (reopened if another test replaced the bus)."""
    from speck.usbgpu.sim import shim

    if not _SESSION or not any(m is _SESSION[0][1] for m in shim.installed_models()):
        if _SESSION:
            _SESSION.pop()[0].close()
        dev = SimDevice()
        _SESSION.append((UsbGpu.open(sim=dev), dev))
    yield _SESSION[0]


def roundtrip(gpu: UsbGpu, dev: SimDevice, data: bytes, offset: int) -> None:
    """copyin at `offset` of a pre-filled buffer, then check VRAM (backdoor) and copyout (through the driver)."""
    buf = gpu.alloc(offset + len(data) + 64)
    fill = bytes([0xEE]) * buf.size
    dev.vram.write(buf.va, fill)
    doorbells = dev.stats["doorbells"]
    gpu.copyin(buf, data, offset)
    if data and gpu.context.options.mode == "g3":
        assert dev.stats["doorbells"] - doorbells == 1, "G3 rings exactly one doorbell per copy-in"
    expected = fill[:offset] + data + fill[offset + len(data) :]
    assert dev.read_vram(buf.va, buf.size) == expected
    out = bytearray(len(data))
    gpu.copyout(out, buf, offset)
    assert out == data
    assert dev.violations == []


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from(SIZES), offset=st.integers(0, 4096), seed=st.integers(0, 2**32))
def test_g3_roundtrip_sizes_at_random_offsets(
    session: tuple[UsbGpu, SimDevice], size: int, offset: int, seed: int
) -> None:
    gpu, dev = session
    roundtrip(gpu, dev, payload(size, seed), offset)


@pytest.mark.parametrize("size", SIZES)
def test_g3_every_listed_size(session: tuple[UsbGpu, SimDevice], size: int) -> None:
    gpu, dev = session
    roundtrip(gpu, dev, payload(size, size), 3)


@pytest.mark.slow
def test_g3_64mb_roundtrip() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        roundtrip(gpu, dev, payload(64_000_000, 64), 12345)


@pytest.mark.parametrize("f4gate", [True, False])
def test_g0_and_e4_gate_roundtrip(f4gate: bool) -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev, mode="g0") as gpu:
        for size in (1, 512 * KIB, 1100 * KIB + 3):
            roundtrip(gpu, dev, payload(size, size), 5)
        assert dev.stats["doorbells"] >= 3  # G0 rings one doorbell per 512 KiB chunk
    dev = SimDevice()
    with UsbGpu.open(sim=dev, f4gate=f4gate) as gpu:
        roundtrip(gpu, dev, payload(5 * CP_SIZE + 99, 7), 0)
        assert (gpu.copy_stats.f4_attempts > 0) == f4gate


@settings(max_examples=12)
@given(
    link=st.floats(150e6, 2.5e9),
    latency=st.floats(0, 200e3),
    rtt=st.floats(10e3, 1e6),
    sdma=st.floats(20e6, 10e9),
    gpu_write=st.floats(0, 50e3),
    recheck=st.floats(0, 20e3),
    switch=st.floats(0, 50e3),
    compares=st.sampled_from(["first", "full", "either"]),
    f4gate=st.booleans(),
    zero_copy=st.booleans(),
    size=st.integers(1, 5 * CP_SIZE + 1000),
    seed=st.integers(0, 2**32),
)
def test_no_protocol_violations_under_random_timing(
    link: float,
    latency: float,
    rtt: float,
    sdma: float,
    gpu_write: float,
    recheck: float,
    switch: float,
    compares: str,
    f4gate: bool,
    zero_copy: bool,
    size: int,
    seed: int,
) -> None:
    timing = SimTiming(
        link_bytes_per_s=link,
        bulk_latency_ns=latency,
        control_rtt_ns=rtt,
        sdma_bytes_per_s=sdma,
        gpu_write_ns=gpu_write,
        poll_recheck_ns=recheck,
        arm_switch_ns=switch,
    )
    dev = SimDevice(timing=timing, faults=SimFaults(f4_compares=compares))  # type: ignore[arg-type]
    with UsbGpu.open(sim=dev, f4gate=f4gate, zero_copy=zero_copy) as gpu:
        data = payload(size, seed)
        roundtrip(gpu, dev, data, seed % 4096)
        roundtrip(gpu, dev, data[: size // 3], 0)  # a second copy-in reuses counters, flags and sentinels


@pytest.mark.parametrize("zero_copy", [True, False])
def test_gpu_slower_than_the_link_gets_correct_data(zero_copy: bool) -> None:
    slow = SimTiming(sdma_bytes_per_s=60e6)  # the GPU copies a 120 KiB part in ~2 ms, the link sends it in 0.12 ms
    dev = SimDevice(timing=slow)
    with UsbGpu.open(sim=dev, zero_copy=zero_copy) as gpu:
        roundtrip(gpu, dev, payload(6 * CP_SIZE, 1), 0)
        assert gpu.copy_stats.split_chunks > 0  # the second halves waited for the full flag


def test_staged_wire_sends_one_transfer_per_chunk_unless_split() -> None:
    counts = {}
    for zero_copy in (True, False):
        dev = SimDevice(timing=SimTiming(control_rtt_ns=300e3))  # slow requests: the full flag is in every reply
        with UsbGpu.open(sim=dev, zero_copy=zero_copy) as gpu:
            buf = gpu.alloc(5 * CP_SIZE)
            gpu.copyin(buf, b"warm")
            before = dev.stats["bulk_out_transfers"]
            gpu.copyin(buf, payload(5 * CP_SIZE, 11))
            assert dev.read_vram(buf.va, 5 * CP_SIZE) == payload(5 * CP_SIZE, 11)
            assert gpu.copy_stats.split_chunks == 0
            counts[zero_copy] = dev.stats["bulk_out_transfers"] - before - 3  # minus ring stream, wptr, doorbell
    assert counts == {True: 4 * 5, False: 5}


def test_first_part_gate_alone_is_caught_by_the_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    original = CopyEngine._gate

    def first_part_only(self: CopyEngine, ch: object, target: int) -> bool:
        original(self, ch, target)  # type: ignore[arg-type]
        return True  # pretend the full flag was reached: send the whole chunk at once

    monkeypatch.setattr(CopyEngine, "_gate", first_part_only)
    dev = SimDevice(timing=SimTiming(sdma_bytes_per_s=60e6))
    with UsbGpu.open(sim=dev, poll_limit=5000) as gpu:
        buf = gpu.alloc(6 * CP_SIZE)
        gpu.copyin(buf, payload(6 * CP_SIZE, 2))
    assert any("host overwrote SRAM data the GPU had not copied yet" in v for v in dev.violations)


def _sentinel_poisoned(n: int, value: int) -> bytes:
    """Data whose every sector starts with the sentinel value the driver is about to use."""
    data = bytearray(payload(n, 3))
    for off in range(0, n - 3, 512):
        struct.pack_into("<I", data, off, value)
    return bytes(data)


@pytest.mark.parametrize("avoid", [True, False])
def test_stale_sram_never_matches_a_sentinel(monkeypatch: pytest.MonkeyPatch, avoid: bool) -> None:
    if not avoid:  # prove the test has teeth: without the shadow check the GPU copies stale data
        monkeypatch.setattr(CopyEngine, "_next_sentinel", lambda self, avoid: _plain_next(self))
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        engine = gpu._copy
        assert engine is not None
        buf = gpu.alloc(4 * CP_SIZE)
        # 1) user data left in the bounce buffers by a full copy-in (its 4 parts use sentinels 1..4)
        gpu.copyin(buf, _sentinel_poisoned(2 * CP_SIZE, 0x51000005))
        small = payload(3000, 4)
        gpu.copyin(buf, small)  # one part; its sentinel would be 0x51000005, which stale SRAM already holds
        ok_user = dev.read_vram(buf.va, len(small)) == small
        # 2) copy-out leaves arbitrary VRAM data in bounce buffer 0
        upcoming = 0x51000000 | (engine._seq24 + 1)
        dev.vram.write(buf.va + CP_SIZE, _sentinel_poisoned(CP_SIZE, upcoming))
        out = bytearray(CP_SIZE)
        gpu.copyout(out, buf, CP_SIZE)
        small2 = payload(5000, 5)
        gpu.copyin(buf, small2)
        ok_copyout = dev.read_vram(buf.va, len(small2)) == small2
    if avoid:
        assert ok_user and ok_copyout and dev.violations == []
    else:
        assert not ok_user and not ok_copyout
        assert any("GPU read a part before its sentinel landed" in v for v in dev.violations)


def _plain_next(self: CopyEngine) -> int:
    self._seq24 = (self._seq24 + 1) & 0xFFFFFF
    return 0x51000000 | self._seq24


def test_one_doorbell_per_copyin_and_ring_wraps(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    ring = gpu.context.ring
    buf = gpu.alloc(2 * CP_SIZE)
    # fill the 1 MiB ring with NOPs up to 40 bytes before its end, so the next batch must wrap with a zero fill
    remaining = (ring.size - ring.put_value % ring.size - 40) // 4
    while remaining:
        count = min(remaining, 0x3FFF)
        ring.submit(nop(count - 1))
        remaining -= count
    ring_before = dev.stats["doorbells"]
    for n in (1, CP_SIZE + 1, 2 * CP_SIZE):
        data = payload(n, n)
        gpu.copyin(buf, data)
        assert dev.read_vram(buf.va, n) == data
    assert dev.stats["doorbells"] - ring_before == 3
    # the engine consumed the whole ring up to the put value and wrote its read pointer back
    from speck.usbgpu.gpu import QUEUE_PAGE_VA

    assert struct.unpack("<Q", dev.read_vram(QUEUE_PAGE_VA, 8))[0] == ring.put_value == dev.sdma.rptr
    assert dev.violations == []


@settings(max_examples=10)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["in", "out"]), st.integers(1, 3 * CP_SIZE), st.integers(0, 12)),
        min_size=2,
        max_size=5,
    ),
    seed=st.integers(0, 2**32),
)
def test_poisoned_data_and_copyouts_never_fake_a_sentinel(ops: list[tuple[str, int, int]], seed: int) -> None:
    """Every sector of every payload starts with a value the driver is about to use as a sentinel."""
    rng = random.Random(seed)
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        engine = gpu._copy
        assert engine is not None
        buf = gpu.alloc(3 * CP_SIZE)
        for kind, size, spread in ops:
            data = bytearray(payload(size, rng.randrange(2**32)))
            upcoming = engine._seq24 + 1
            for off in range(0, size - 3, 512):
                struct.pack_into("<I", data, off, 0x51000000 | (upcoming + rng.randrange(spread + 1)))
            if kind == "in":
                gpu.copyin(buf, data)
                assert dev.read_vram(buf.va, size) == data
            else:  # put the poison in VRAM and pull it through bounce buffer 0
                dev.vram.write(buf.va, bytes(data))
                out = bytearray(size)
                gpu.copyout(out, buf)
                assert out == data
    assert dev.violations == []


def test_copyin_larger_than_one_ring_build_runs_in_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    import speck.usbgpu.copyin as copyin

    monkeypatch.setattr(copyin, "MAX_G3_PASS", 2 * CP_SIZE)  # stands in for 1 GiB
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(5 * CP_SIZE + 117)
        data = payload(5 * CP_SIZE + 17, 21)
        before = dev.stats["doorbells"]
        gpu.copyin(buf, data, 100)
        assert dev.stats["doorbells"] - before == 3  # one ring build and doorbell per pass
        assert dev.read_vram(buf.va + 100, len(data)) == data
    assert dev.violations == []


def test_ring_batch_is_fence_flags_and_one_timeline_fence_and_templates_match_fresh_packets() -> None:
    from speck.usbgpu.amd.sdma import FUNC_GE, fence, poll_regmem
    from speck.usbgpu.amd.tables import SDMA
    from speck.usbgpu.copyin import PART

    OP_COPY, OP_FENCE, OP_POLL_REGMEM, OP_WRITE = SDMA.OP_COPY, SDMA.OP_FENCE, SDMA.OP_POLL_REGMEM, SDMA.OP_WRITE

    with UsbGpu.open(sim=SimDevice()) as gpu:
        engine, timeline = gpu._copy, gpu.context.timeline
        assert engine is not None
        data = memoryview(payload(5 * CP_SIZE + PART + 1000, 3))  # five full chunks and a two-part tail
        chunks = engine._plan(data)
        value = timeline.value
        batch = engine._ring_batch(0x123456789, chunks)
        expected = poll_regmem(timeline.va, value - 1, FUNC_GE)
        for ch in chunks:
            expected += engine._chunk_packets(ch, 0x123456789 + ch.src_off)
        expected += fence(timeline.va, value)
        assert batch == expected and timeline.value == value + 1
        sizes = {OP_POLL_REGMEM: 6, OP_COPY: 7, OP_FENCE: 4}
        ops, pos = [], 0
        while pos < len(batch):
            op = batch[pos] & 0xFF
            ops.append(op)
            pos += sizes[op]
        assert pos == len(batch) and OP_WRITE not in ops
        assert ops.count(OP_FENCE) == 2 * len(chunks) + 1  # two flags per chunk, one timeline write per copy-in
        assert len(engine._chunk_packets(chunks[0], 0)) == 34  # per full chunk: 2 x (POLL + COPY) + 2 FENCE
