"""The compute queue end to end over the simulated USB link: PM4 built by speck.usbgpu.amd.pm4, written into the ring
in VRAM, fetched and executed by the simulated command processor; timeline signals, cross-queue waits, indirect-buffer
batches, faults and hangs reported as named errors through the interrupt ring, and queue reset."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import bring_up, ring_doorbell
from speck.usbgpu.amd import pm4
from speck.usbgpu.amd.layout import COMPUTE_DOORBELL
from speck.usbgpu.amd.sdma import fence
from speck.usbgpu.amd.tables import GC, PM4, PM4_PACKETS
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import GpuFault, GpuHang
from speck.usbgpu.sim.device import SimDevice


@pytest.fixture
def session() -> tuple[UsbGpu, SimDevice]:
    dev = SimDevice()
    gpu = UsbGpu.open(sim=dev)
    yield gpu, dev  # type: ignore[misc]
    gpu.close()


def words(dev: SimDevice, va: int, n: int) -> tuple[int, ...]:
    return struct.unpack(f"<{n}I", dev.read_vram(va, 4 * n))


@given(st.sampled_from([PM4.NOP, PM4.SET_SH_REG, PM4.WRITE_DATA, PM4.RELEASE_MEM]), st.integers(1, 1 << 14))
def test_header_fields_round_trip(opcode: int, body: int) -> None:
    h = PM4_PACKETS.HEADER.decode([pm4.header(opcode, body)])
    assert (h["type"], h["opcode"], h["count"], h["shader_type"]) == (3, opcode, body - 1, 1)


def test_packets_execute_in_order_and_signal_the_timeline(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    v1 = gpu.submit(pm4.nop(5) + pm4.write_data(buf.va, [1, 2, 3]) + pm4.acquire_mem())
    v2 = gpu.submit(pm4.write_data(buf.va + 4, [9]) + pm4.release_mem(buf.va + 64, 0xAABBCCDD_11223344))
    gpu.wait(v2)
    assert (v1, v2) == (1, 2) and gpu.completed() == 2
    assert words(dev, buf.va, 3) == (1, 9, 3)  # the second write landed after the first
    assert dev.read_vram(buf.va + 64, 8) == struct.pack("<Q", 0xAABBCCDD_11223344)
    st = gpu.queue_status()
    assert st.active and st.idle and not st.faults and st.rptr == st.wptr > 0
    (hqd,) = dev.gpu.cp.queues.values()
    assert hqd.acquires == 1 and hqd.packets == 7 and dev.violations == []


def test_release_mem_32_bit_write_and_end_of_pipe_interrupt(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    dev.vram.write(buf.va, b"\xff" * 8)
    v = gpu.submit(pm4.release_mem(buf.va, 0x12345678_9ABCDEF0, interrupt=True, data64=False))
    gpu.wait(v)
    assert dev.read_vram(buf.va, 8) == struct.pack("<I", 0x9ABCDEF0) + b"\xff" * 4  # only the low dword
    eop = [i for i in dev.gpu.ih.posted if i.src_id == 181]  # GFX_11_0_0__SRCID__CP_EOP_INTERRUPT
    assert len(eop) == 1 and gpu.queue_status().faults == ()  # end-of-pipe interrupts are not faults


def test_an_indirect_buffer_batch_is_one_doorbell(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    batch: list[int] = []
    for i in range(100):
        batch += pm4.write_data(buf.va + 4 * i, [i * 7])
    doorbells = dev.stats["doorbells"]
    v = gpu.submit(batch, batch=True)
    assert dev.stats["doorbells"] == doorbells + 1
    gpu.wait(v)
    assert words(dev, buf.va, 100) == tuple(i * 7 for i in range(100))
    st = gpu.queue_status()
    assert st.wptr == len(pm4.indirect_buffer(0, 1, 1)) + len(pm4.release_mem(0, 0))  # the ring holds 2 packets


def test_the_ring_wraps_and_waits_for_room(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    ring_dwords = gpu.context.compute.layout.ring_bytes // 4  # type: ignore[union-attr]
    chunk = pm4.nop(4000)  # 4001 dwords per submission: the ring wraps every ~16 submissions
    last = 0
    for i in range(40):
        last = gpu.submit(chunk + pm4.write_data(buf.va, [i]))
    gpu.wait(last)
    assert words(dev, buf.va, 1) == (39,) and gpu.queue_status().wptr > 2 * ring_dwords
    assert dev.violations == []


def test_compute_waits_for_memory_another_queue_writes(session: tuple[UsbGpu, SimDevice]) -> None:
    """WAIT_REG_MEM stalls the compute queue until the SDMA queue's FENCE writes the awaited value."""
    gpu, dev = session
    buf = gpu.alloc(4096)
    flag, out = buf.va, buf.va + 256
    v = gpu.submit(pm4.wait_reg_mem(flag, 5, PM4.WAIT_FUNCTION_GE) + pm4.write_data(out, [42]))
    dev.wait(None, 5)  # 5 ms of virtual time: the queue is stuck on the flag
    assert gpu.completed() == v - 1 and words(dev, out, 1) == (0,)
    gpu.context.ring.submit(fence(flag, 4))  # not enough
    dev.wait(None, 5)
    assert words(dev, out, 1) == (0,)
    gpu.context.ring.submit(fence(flag, 7))
    gpu.wait(v)
    assert words(dev, out, 1) == (42,)


def test_a_copy_waits_on_the_gpu_for_compute_work_issued_before_it(session: tuple[UsbGpu, SimDevice]) -> None:
    """The copy-out's SDMA batch polls the compute timeline: it reads what the compute queue wrote although the
    host never waited for it."""
    gpu, dev = session
    buf = gpu.alloc(4096)
    flag = buf.va + 2048
    slow = pm4.nop(1) * 10_000  # 2 ms of command processor time before the write
    gpu.submit(
        pm4.wait_reg_mem(flag, 1, PM4.WAIT_FUNCTION_EQ) + slow + pm4.write_data(buf.va, [0x5EED] * 16), batch=True
    )
    gpu.context.ring.submit(fence(flag, 1))  # the SDMA releases the compute queue ...
    out = bytearray(64)
    gpu.copyout(out, buf)  # ... and its copy-out must still wait for the compute queue's write
    assert out == struct.pack("<16I", *[0x5EED] * 16) and dev.violations == []


@pytest.mark.parametrize(
    ("packets", "kind", "detail"),
    [
        ([pm4.header(0x99, 1), 0], "bad PM4 opcode", "packet header 0xc0009902"),
        ([pm4.header(PM4.NOP, 100)], "malformed PM4 packet", "packet header"),  # runs past the write pointer
        (pm4.set_sh_reg(GC.COMPUTE_PGM_LO, [1], 0x1260)[:1] + [0x3FFF, 1], "privileged register", ""),
    ],
)
def test_bad_packets_stop_the_queue_with_a_record_and_reset_recovers(
    session: tuple[UsbGpu, SimDevice], packets: list[int], kind: str, detail: str
) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    v = gpu.submit(packets)
    with pytest.raises(GpuFault, match=f"compute me1 pipe0 queue0: {kind}") as e:
        gpu.wait(v, timeout=0.05)
    assert detail in str(e.value) and "reset_queue" in str(e.value)
    st = gpu.queue_status()
    assert st.faulted and not st.hung and st.faults[0].kind.startswith(kind)
    gpu.reset_queue()
    assert gpu.queue_status().faults == () and gpu.completed() == v
    gpu.wait(gpu.submit(pm4.write_data(buf.va, [77])))
    assert words(dev, buf.va, 1) == (77,)


def test_nested_indirect_buffers_fault(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, _ = session
    buf = gpu.alloc(4096)
    v = gpu.submit(pm4.indirect_buffer(buf.va, 4, 1), batch=True)
    with pytest.raises(GpuFault, match="malformed PM4 packet"):
        gpu.wait(v, timeout=0.05)


@pytest.mark.parametrize("where", ["write_data", "release_mem"])
def test_a_write_to_unmapped_memory_is_a_page_fault_naming_address_and_access(
    session: tuple[UsbGpu, SimDevice], where: str
) -> None:
    gpu, dev = session
    bad = 0x40_0000_1000  # 256 GiB: nothing is mapped there
    packets = pm4.write_data(bad, [1]) if where == "write_data" else pm4.release_mem(bad, 1)
    v = gpu.submit(packets)
    with pytest.raises(GpuFault, match=f"page fault at GPU address {bad:#x} .write., VMID 1") as e:
        gpu.wait(v, timeout=0.05)
    record = e.value.record
    assert record.address == bad and record.access == "write" and record.queue == "compute me1 pipe0 queue0"  # type: ignore[attr-defined]
    gpu.reset_queue()
    buf = gpu.alloc(64)
    gpu.wait(gpu.submit(pm4.write_data(buf.va, [3])))
    assert words(dev, buf.va, 1) == (3,)


def test_a_queue_stuck_on_a_wait_is_a_hang_within_the_timeout(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    buf = gpu.alloc(4096)
    v = gpu.submit(pm4.wait_reg_mem(buf.va, 1, PM4.WAIT_FUNCTION_EQ))
    start = dev.now_ns
    with pytest.raises(GpuHang, match=r"compute me1 pipe0 queue0 hung: no signal 1 after 0.2 s of GPU time") as e:
        gpu.wait(v, timeout=0.2)
    assert 0.2e9 <= dev.now_ns - start < 0.3e9  # bounded in (virtual) GPU time
    assert e.value.queue == "compute me1 pipe0 queue0"
    # the simulator adds what holds the queue up: the wait, its dword (at the buffer's VRAM page) and its value
    assert "simulator: waiting (WAIT_REG_MEM) for the dword at vram" in e.value.status
    assert "== 0x1; it holds 0x0" in e.value.status
    assert gpu.queue_status().hung
    gpu.reset_queue()
    assert not gpu.queue_status().hung
    assert gpu.completed() == v  # the dropped work counts as signalled
    gpu.wait(gpu.submit(pm4.write_data(buf.va + 8, [1])))


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40), st.booleans())
def test_write_data_round_trips_through_ring_or_batch(values: list[int], batch: bool) -> None:
    with UsbGpu.open(sim=SimDevice()) as gpu:
        buf = gpu.alloc(4096)
        gpu.wait(gpu.submit(pm4.write_data(buf.va, values), batch=batch))
        assert words(gpu.sim, buf.va, len(values)) == tuple(values)  # type: ignore[arg-type]


# ---------------------------------------------------------------- bring-up refusals, without USB
def test_a_doorbell_before_the_compute_queue_is_initialized_is_refused_naming_the_step() -> None:
    dev = SimDevice()
    mmio, card = bring_up(dev)
    mmio.write_fields(GC.GRBM_GFX_CNTL, MEID=1)
    card.compute.deactivate()
    mmio.write_fields(GC.GRBM_GFX_CNTL)
    ring_doorbell(dev, COMPUTE_DOORBELL, 8)
    assert any("not active (CP_HQD_ACTIVE=0" in v and "'compute queue'" in v for v in dev.violations)


def test_activating_a_queue_while_the_mec_is_halted_is_refused_naming_the_step() -> None:
    dev = SimDevice()
    mmio, card = bring_up(dev)
    mmio.update(GC.CP_MEC_RS64_CNTL, MEC_HALT=1)
    card.compute.setup()
    assert any("MEC is halted" in v and "'cp'" in v for v in dev.violations)
    assert not dev.gpu.cp.queues
