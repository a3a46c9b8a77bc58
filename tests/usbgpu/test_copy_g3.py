"""Copy-in (G3, G0) and copy-out through the real transport, fake libusb and C helper, against the simulator."""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def forced_upload(on: bool = True) -> Iterator[None]:
    """Every G3 batch uploaded through a bounce buffer (on) instead of only long ones: small copies exercise it."""
    import speck.usbgpu.copyin as copyin

    saved = copyin.UPLOAD_MIN_DWORDS
    if on:
        copyin.UPLOAD_MIN_DWORDS = 0
    try:
        yield
    finally:
        copyin.UPLOAD_MIN_DWORDS = saved


def roundtrip(gpu: UsbGpu, dev: SimDevice, data: bytes, offset: int) -> None:
    """copyin at `offset` of a pre-filled buffer, then check VRAM (backdoor) and copyout (through the driver)."""
    buf = gpu.alloc(offset + len(data) + 64)
    fill = bytes([0xEE]) * buf.size
    dev.vram.write(buf.va, fill)
    doorbells = dev.stats["doorbells"]
    gpu.copyin(buf, data, offset)
    if data and gpu.context.options.mode == "g3":
        # one doorbell for a batch streamed over 0xF0; an uploaded one rings for its boot batch and then for itself
        expected_doorbells = 2 if CopyEngine._upload_space(len(data)) else 1
        assert dev.stats["doorbells"] - doorbells == expected_doorbells, "G3 rings once per ring build"
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
    upload=st.booleans(),
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
    upload: bool,
    size: int,
    seed: int,
) -> None:
    with forced_upload(upload):
        _random_timing_roundtrips(link, latency, rtt, sdma, gpu_write, recheck, switch, compares, f4gate, zero_copy,
                                  size, seed)  # fmt: skip


def _random_timing_roundtrips(
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
    upload=st.booleans(),
)
def test_poisoned_data_and_copyouts_never_fake_a_sentinel(
    ops: list[tuple[str, int, int]], seed: int, upload: bool
) -> None:
    """Every sector of every payload starts with a value the driver is about to use as a sentinel (with uploaded
    batches too: the upload's sentinel and image share bounce buffer 1 with the chunks)."""
    rng = random.Random(seed)
    dev = SimDevice()
    with forced_upload(upload), UsbGpu.open(sim=dev) as gpu:
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


# ---------------------------------------------------------------------------------------------- uploaded batches


def test_a_long_batch_is_uploaded_and_only_the_boot_batch_goes_over_f0() -> None:
    """A copy-in of 16 chunks: its 554-dword batch reaches the ring through a bounce buffer (a bulk OUT and an SDMA
    copy), only the 17-dword boot batch is streamed over 0xF0 (~1.1 us a dword on the bridge), and the copy-in takes
    less simulated time than with the batch streamed."""
    import speck.usbgpu.copyin as copyin

    data = payload(16 * CP_SIZE - 5, 16)
    took = {}
    for upload in (False, True):
        dev = SimDevice()
        with UsbGpu.open(sim=dev) as gpu:
            buf = gpu.alloc(len(data))
            gpu.copyin(buf, data[:4096])
            stats = gpu.copy_stats
            f0, up, t0 = stats.ring_dwords, stats.uploaded_dwords, dev.now_ns
            saved = copyin.UPLOAD_MIN_DWORDS
            copyin.UPLOAD_MIN_DWORDS = saved if upload else 1 << 30
            try:
                roundtrip(gpu, dev, data, 0)
            finally:
                copyin.UPLOAD_MIN_DWORDS = saved
            took[upload] = dev.now_ns - t0
            if upload:
                assert stats.ring_dwords - f0 == 6 + 7 + 4 and stats.uploaded_dwords - up >= 6 + 34 * 16 + 4
            else:  # the timeline wait, 16 two-part chunks, the timeline FENCE
                assert stats.ring_dwords - f0 == 6 + 34 * 16 + 4 and stats.uploaded_dwords == up
    assert took[True] < took[False]


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.sampled_from([1, 511, 512, CP_SIZE - 1, CP_SIZE, CP_SIZE + 1, 0x1E000 + 1, 3 * CP_SIZE + 7]),
    offset=st.integers(0, 4096),
    seed=st.integers(0, 2**32),
)
def test_uploaded_batches_round_trip_at_awkward_sizes(
    session: tuple[UsbGpu, SimDevice], size: int, offset: int, seed: int
) -> None:
    gpu, dev = session
    stats = gpu.copy_stats
    up = stats.uploaded_dwords
    with forced_upload():
        roundtrip(gpu, dev, payload(size, seed), offset)
    assert stats.uploaded_dwords > up


def test_an_uploaded_batch_that_would_cross_the_ring_end_skips_the_tail_with_nops() -> None:
    from speck.usbgpu.gpu import QUEUE_PAGE_VA

    dev = SimDevice()
    with forced_upload(), UsbGpu.open(sim=dev) as gpu:
        ring = gpu.context.ring
        for room in (40, 400):  # a tail shorter than the boot batch, and one the boot batch fits but not the image
            remaining = (ring.size - ring.put_value % ring.size - room) // 4
            while remaining:
                count = min(remaining, 0x3FFF)
                ring.submit(nop(count - 1))
                remaining -= count
            data = payload(3 * CP_SIZE - 1, room)
            before = ring.put_value
            roundtrip(gpu, dev, data, 0)
            assert ring.put_value // ring.size == before // ring.size + 1  # it wrapped
            assert struct.unpack("<Q", dev.read_vram(QUEUE_PAGE_VA, 8))[0] == ring.put_value == dev.sdma.rptr
    assert dev.violations == []


@st.composite
def _batches(draw: st.DrawFn) -> list[int]:
    from speck.usbgpu.amd.tables import SDMA

    sizes = {SDMA.OP_POLL_REGMEM: 6, SDMA.OP_COPY: 7, SDMA.OP_FENCE: 4}
    word = st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 0xFFFFFF).map(lambda v: 0x51000000 | v))
    out: list[int] = []
    for op in draw(st.lists(st.sampled_from(sorted(sizes)), min_size=1, max_size=200)):
        out += [op, *draw(st.lists(word, min_size=sizes[op] - 1, max_size=sizes[op] - 1))]
    return out


@settings(max_examples=60)
@given(batch=_batches())
def test_an_uploaded_image_never_has_a_sentinel_look_alike_at_a_sector_start_and_runs_the_same_packets(
    batch: list[int],
) -> None:
    from speck.usbgpu.amd.tables import SDMA

    sizes = {SDMA.OP_POLL_REGMEM: 6, SDMA.OP_COPY: 7, SDMA.OP_FENCE: 4}
    image = CopyEngine._sector_safe(batch)
    assert all(w >> 24 != 0x51 for w in image[::128])
    packets, pos = [], 0  # what the engine runs: one-dword NOPs (zero dwords) skipped
    while pos < len(image):
        if image[pos] == 0:
            pos += 1
            continue
        packets += image[pos : pos + sizes[image[pos] & 0xFF]]
        pos += sizes[image[pos] & 0xFF]
    assert packets == batch


def test_make_room_skips_a_long_tail_with_nop_headers_only() -> None:
    """A tail longer than one NOP can skip (16384 dwords) gets several headers, each covering up to the next, and
    nothing else is written to it; the returned VA is the ring start."""
    from speck.usbgpu.amd.sdma import SdmaRing

    class Bars:
        def __init__(self) -> None:
            self.writes: list[tuple[int, bytes]] = []

        def stream_write(self, address: int, data: bytes | bytearray | memoryview) -> None:
            self.writes.append((address, bytes(data)))

        def stream_read(self, address: int, n: int) -> bytes:
            raise AssertionError("make_room never reads")

    bars = Bars()
    ring = SdmaRing(bars, ring_va=0x10000, wptr_va=0, vram_bar=0x1000_0000, doorbell_bar=0)
    ring.put_value = 3 * ring.size - 70_000
    assert ring.make_room(100_000) == 0x10000 and ring.put_value == 3 * ring.size
    pos = ring.size - 70_000
    for address, data in bars.writes:
        assert address == 0x1000_0000 + 0x10000 + pos and len(data) == 4
        header = struct.unpack("<I", data)[0]
        assert header & 0xFF == 0  # NOP
        pos += 4 * (1 + (header >> 16 & 0x3FFF))
    assert pos == ring.size and len(bars.writes) == 2
    assert ring.make_room(100) == 0x10000 and len(bars.writes) == 2  # room at the start: nothing written
