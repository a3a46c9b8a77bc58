"""Unit tests of the bridge + GPU simulator, driven directly through its UsbDeviceModel interface (no libusb)."""

from __future__ import annotations

import operator
import struct

from hypothesis import given
from hypothesis import strategies as st

from simgpu import bring_up, submit
from speck.usbgpu.amd.layout import SYS_VA
from speck.usbgpu.amd.tables import GC
from speck.usbgpu.sim.config import (
    CQ_PCIE,
    SQ_PCIE,
    SRAM_PCIE,
    SimFaults,
    SimTiming,
)
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.model_api import TransferResult, TransferStatus, UsbDeviceModel

SYS = SYS_VA
HEAP = 0x380000  # free VRAM inside the driver area the bring-up maps (VA = VRAM offset)


def ctrl(
    d: SimDevice,
    req_type: int,
    req: int,
    value: int,
    index: int,
    data: bytes = b"",
    length: int = 0,
    timeout_ms: int = 1000,
) -> TransferResult:
    setup = struct.pack("<BBHHH", req_type, req, value, index, length if req_type & 0x80 else len(data))
    tid = d.submit("control", 0, setup, data, length, timeout_ms)
    return dict(d.wait([tid], timeout_ms + 1))[tid]


def bulk_out(d: SimDevice, data: bytes, timeout_ms: int = 1000) -> TransferResult:
    tid = d.submit("bulk", 0x02, None, data, 0, timeout_ms)
    return dict(d.wait([tid], timeout_ms + 1))[tid]


def bulk_in(d: SimDevice, n: int, timeout_ms: int = 1000) -> TransferResult:
    tid = d.submit("bulk", 0x81, None, b"", n, timeout_ms)
    return dict(d.wait([tid], timeout_ms + 1))[tid]


def arm_out(d: SimDevice, sectors: int, slot: int, slots: int) -> TransferResult:
    return ctrl(d, 0x40, 0xF2, sectors, slot | slots << 8)


def test_simdevice_implements_the_model_protocol() -> None:
    assert isinstance(SimDevice(), UsbDeviceModel)


def test_xdata_windows_alias_sram_and_queue_pages() -> None:
    d = SimDevice()
    for addr, value in ((0xF000 + 5, 0x11), (0xA800 + 3, 0x22), (0xB800 + 12, 0x33), (0x1234, 0x44)):
        assert ctrl(d, 0x40, 0xE5, addr, value).status == TransferStatus.COMPLETED
        assert ctrl(d, 0xC0, 0xE4, addr, 0, length=1).data == bytes([value])
    assert d.mem.sram[5] == 0x11 and d.mem.sq[0x803] == 0x22 and d.mem.cq[12] == 0x33
    # the SRAM window shows live SRAM contents written by the DMA engine
    arm_out(d, 1, 0, 1)
    bulk_out(d, bytes(range(256)) * 2)
    assert ctrl(d, 0xC0, 0xE4, 0xF000, 0, length=16).data == bytes(range(16))


def test_ltssm_follows_power_requests() -> None:
    d = SimDevice()
    assert ctrl(d, 0xC0, 0xE4, 0xB450, 0, length=1).data != b"\x78"
    before = d.now_ns
    ctrl(d, 0x40, 0xF3, 1, 0, timeout_ms=10000)
    assert d.now_ns - before >= d.timing.link_power_on_ns
    assert ctrl(d, 0xC0, 0xE4, 0xB450, 0, length=1).data == b"\x78"
    ctrl(d, 0x40, 0xF3, 0, 0)
    assert ctrl(d, 0xC0, 0xE4, 0xB450, 0, length=1).data != b"\x78"


def test_data_before_arm_is_misrouted_and_recorded() -> None:
    d = SimDevice()
    res = bulk_out(d, b"\xab" * 4096, timeout_ms=50)
    assert res.status == TransferStatus.TIMED_OUT and res.actual_length == 1024  # one packet, then NAK
    assert d.mem.xdata[0x7000:0x7400] == b"\xab" * 1024
    assert d.stats["misrouted_packets"] == 1
    assert len(d.violations) == 1 and "nothing armed" in d.violations[0]


def test_transfer_longer_than_arm_overflows_into_misroute() -> None:
    d = SimDevice()
    arm_out(d, 2, 0, 1)
    res = bulk_out(d, b"\x01" * 1024, timeout_ms=50)  # exactly the armed sectors
    assert res.actual_length == 1024 and res.status == TransferStatus.COMPLETED
    assert bytes(d.mem.sram[:1024]) == b"\x01" * 1024
    assert d.violations == []
    arm_out(d, 1, 0, 1)
    res = bulk_out(d, b"\x03" * 2048, timeout_ms=50)
    assert res.status == TransferStatus.TIMED_OUT and res.actual_length == 1536
    assert len(d.violations) == 1


def test_shorter_transfer_leaves_arm_partially_consumed_then_next_transfer_continues() -> None:
    d = SimDevice()
    arm_out(d, 4, 2, 1)
    bulk_out(d, b"\x05" * 1024)
    assert d.dma.current is not None and d.dma.current.remaining == 1024
    bulk_out(d, b"\x06" * 1024)
    assert d.dma.current is None
    base = 2 * 0x4000
    assert bytes(d.mem.sram[base : base + 2048]) == b"\x05" * 1024 + b"\x06" * 1024
    assert d.violations == []


def test_arm_during_transfer_is_latched_and_takes_effect_after_current_sectors() -> None:
    d = SimDevice()
    arm_out(d, 256, 0, 8)  # 128 KiB: takes ~130 us on the link, longer than half a control round trip
    first = d.submit("bulk", 0x02, None, b"\xaa" * 0x20000, 0, 1000)
    assert arm_out(d, 4, 16, 1).status == TransferStatus.COMPLETED
    if d.dma.latched is None:  # the arm must not have pre-empted the transfer in flight
        raise AssertionError(f"arm was not latched: current={d.dma.current}")
    assert d.dma.latched.start_slot == 16 and d.dma.current is not None and d.dma.current.start_slot == 0
    d.wait([first], 1000)
    second = d.submit("bulk", 0x02, None, b"\xcc" * 1024, 0, 1000)
    d.wait([second], 1000)
    assert bytes(d.mem.sram[:0x20000]) == b"\xaa" * 0x20000
    assert d.dma.current is not None and d.dma.current.start_slot == 16 and d.dma.current.done == 1024
    assert bytes(d.mem.sram[16 * 0x4000 : 16 * 0x4000 + 1024]) == b"\xcc" * 1024
    assert d.violations == []


def test_second_latch_while_one_pending_is_an_error_fault() -> None:
    d = SimDevice()
    arm_out(d, 8, 0, 1)
    arm_out(d, 8, 4, 1)  # nothing is streaming: the first stays current, this one is latched
    res = arm_out(d, 8, 8, 1)
    assert res.status == TransferStatus.STALL
    assert any("already latched" in v for v in d.violations)
    d2 = SimDevice(faults=SimFaults(second_latch="replace"))
    arm_out(d2, 8, 0, 1), arm_out(d2, 8, 4, 1)
    assert arm_out(d2, 8, 8, 1).status == TransferStatus.COMPLETED
    assert d2.dma.latched is not None and d2.dma.latched.start_slot == 8


def test_read_arm_streams_only_after_a_gpu_write_to_the_cq_page() -> None:
    d = SimDevice()
    d.fabric.gpu.set_dword(0x04, 0x7)  # bus mastering, as bridge setup would enable
    d.mem.sram[:1024] = bytes(range(256)) * 4
    assert ctrl(d, 0x40, 0xF2, 2 | 0x8000, 1 << 8).status == TransferStatus.COMPLETED
    assert bulk_in(d, 1024, timeout_ms=20).status == TransferStatus.TIMED_OUT
    tid = d.submit("bulk", 0x81, None, b"", 1024, 1000)
    d.bus_write(CQ_PCIE + 12, bytes(4))
    res = dict(d.wait([tid], 1000))[tid]
    assert res.status == TransferStatus.COMPLETED and res.data == bytes(range(256)) * 4


def test_f4_packing_example_and_blocking_until_the_flag_reaches_the_target() -> None:
    d = SimDevice(timing=SimTiming(f4_wait_limit_ns=5e9))
    assert d.decode_f4(0x0BE2, 0x9010) == (482, 16, 16, 1, 5)
    d.fabric.gpu.set_dword(0x04, 0x7)
    tid = d.submit("control", 0, struct.pack("<BBHHH", 0xC0, 0xF4, 0x0BE2, 0x9010, 32), b"", 32, 30000)
    assert d.wait([tid], 100) == [] and d.dma.current is None  # still blocked after 100 ms
    d.bus_write(SQ_PCIE + 0x818, struct.pack("<Q", 0x105))  # buffer 1 first-part flag, low byte 5
    res = dict(d.wait([tid], 1000))[tid]
    assert res.status == TransferStatus.COMPLETED and res.data[24] == 0x05
    arm = d.dma.current
    assert arm is not None and (arm.sectors, arm.start_slot, arm.num_slots) == (482, 16, 16)


@given(flag=st.integers(0, 255), target=st.integers(0, 255))
def test_f4_compare_is_modular_on_the_low_byte(flag: int, target: int) -> None:
    d = SimDevice()
    d.mem.sq[0x810] = flag
    reached = (flag - target) & 0xFF < 0x80
    assert d.f4_reached(0, target) == reached


def test_f4_bails_after_the_wait_limit_without_arming() -> None:
    d = SimDevice(timing=SimTiming(f4_wait_limit_ns=3e6))
    res = ctrl(d, 0xC0, 0xF4, 0x0BE2, 0x9010, length=32, timeout_ms=30000)
    assert res.status == TransferStatus.COMPLETED and res.data == bytes(32)
    assert d.dma.current is None and d.stats["f4_bails"] == 1
    assert d.now_ns >= 3e6


# ---------------------------------------------------------------- SDMA engine, fed packets directly
def _gpu_with_ring(d: SimDevice, packets: list[int], run_ms: int = 10) -> None:
    bring_up(d)
    submit(d, packets, run_ms)


def _write64(addr: int, value: int) -> list[int]:
    return [2, addr & 0xFFFFFFFF, addr >> 32, 1, value & 0xFFFFFFFF, value >> 32]


def _poll(addr: int, ref: int, func: int, mask: int = 0xFFFFFFFF) -> list[int]:
    return [8 | func << 28 | 1 << 31, addr & 0xFFFFFFFF, addr >> 32, ref, mask, 4 | 0xFFF << 16]


A, B, C, D = HEAP + 0x2000, HEAP + 0x2100, HEAP + 0x3000, HEAP + 0x4000


def test_engine_executes_nop_write_fence_trap_timestamp_and_copy() -> None:
    d = SimDevice()
    d.vram.write(C, bytes(range(200)))
    packets = [0, 0 | 2 << 16, 0, 0]  # one-dword NOP, NOP with two extra dwords
    packets += _write64(A, 0x1122334455667788)
    packets += [5 | 3 << 16, A + 0x10, 0, 0xCAFE]  # FENCE
    packets += [6, 7]  # TRAP
    packets += [13 | 2 << 8, A + 0x20, 0]  # TIMESTAMP
    packets += [1, 199, 0, C, 0, D, 0]  # COPY_LINEAR 200 bytes
    _gpu_with_ring(d, packets)
    assert d.vram.read(A, 8) == struct.pack("<Q", 0x1122334455667788)
    assert d.vram.read(A + 0x10, 4) == struct.pack("<I", 0xCAFE)
    assert d.sdma.traps == 1 and struct.unpack("<Q", d.vram.read(A + 0x20, 8))[0] > 0
    assert d.vram.read(D, 200) == bytes(range(200))
    assert d.sdma.rptr == len(packets) * 4 and d.sdma.idle
    assert d.gpu.ih.posted[-1].src_id == 49 and d.gpu.ih.posted[-1].src_data[0] == 7  # SDMA_TRAP, its context
    assert d.violations == []


_FUNCS = {
    0: lambda v, r: True,
    1: operator.lt,
    2: operator.le,
    3: operator.eq,
    4: operator.ne,
    5: operator.ge,
    6: operator.gt,
}


@given(
    func=st.integers(0, 6),
    value=st.integers(0, 2**32 - 1),
    ref=st.integers(0, 2**32 - 1),
    mask=st.sampled_from([0xFFFFFFFF, 0xFF, 0xFFFF0000, 0]),
)
def test_poll_regmem_compares_masked_dword(func: int, value: int, ref: int, mask: int) -> None:
    d = SimDevice()
    d.vram.write(A, struct.pack("<I", value))
    _gpu_with_ring(d, _poll(A, ref, func, mask) + _write64(B, 1))
    passed = _FUNCS[func](value & mask, ref & mask)
    assert (d.vram.read(B, 8) == struct.pack("<Q", 1)) == passed
    candidates = [v & 0xFFFFFFFF for v in (ref, ref + 1, ref - 1, 0, 0xFFFFFFFF, ~ref)]
    satisfying = [v for v in candidates if _FUNCS[func](v & mask, ref & mask)]
    if not passed and satisfying:  # a stalled poll resumes once the memory satisfies it
        d.gpu.bar0_write(A, struct.pack("<I", satisfying[0]))
        d.wait(None, 1)
        assert d.vram.read(B, 8) == struct.pack("<Q", 1)


def test_stalled_poll_hits_the_watchdog_and_marks_the_queue_hung() -> None:
    d = SimDevice()
    mmio, _ = bring_up(d)
    mmio.update(GC.SDMA0_WATCHDOG_CNTL, QUEUE_HANG_COUNT=1)  # 100 ms
    submit(d, _poll(A, 1, 3) + _write64(B, 1), run_ms=50)
    assert not d.sdma.hung
    d.wait(None, 100)
    assert d.sdma.hung and GC.SDMA0_QUEUE0_CONTEXT_STATUS.get(mmio.read(GC.SDMA0_QUEUE0_CONTEXT_STATUS), "EXCEPTION")
    assert d.gpu.ih.posted[-1].src_id == 55  # GFX_11_0_0__SRCID__SDMA_QUEUE_HANG
    d.gpu.bar0_write(A, struct.pack("<I", 1))
    d.wait(None, 10)
    assert d.vram.read(B, 8) == bytes(8)


def test_an_unmapped_address_faults_the_queue_with_a_record() -> None:
    d = SimDevice()
    mmio, _ = bring_up(d)
    submit(d, _write64(0x40_0000_0000, 5) + _write64(B, 1))  # nothing is mapped at 256 GiB
    assert d.sdma.hung and d.vram.read(B, 8) == bytes(8)  # the queue stopped at the faulting packet
    status = mmio.read(GC.GCVM_L2_PROTECTION_FAULT_STATUS)
    reg = GC.GCVM_L2_PROTECTION_FAULT_STATUS
    assert reg.get(status, "RW") == 1 and reg.get(status, "VMID") == 1 and reg.get(status, "MAPPING_ERROR") == 1
    assert mmio.read(GC.GCVM_L2_PROTECTION_FAULT_ADDR_LO32) == 0x40_0000_0000 >> 12 & 0xFFFFFFFF
    sources = [i.src_id for i in d.gpu.ih.posted]
    assert 0 in sources and 60 in sources  # UTCL2 fault and SDMA_PAGE_FAULT


def test_gpu_copy_of_a_part_overwritten_before_it_was_copied_is_a_violation() -> None:
    d = SimDevice(timing=SimTiming(sdma_bytes_per_s=50e6))  # slow GPU copy: 64 KiB takes 1.3 ms
    src = SYS + SRAM_PCIE
    # part of 64 KiB at slot 0 with its sentinel sector right behind it
    arm_out(d, 129, 0, 5)
    bulk_out(d, b"\x11" * 0x10000 + struct.pack("<I", 0x51000001) + bytes(508))
    copy = [1, 0xFFFF, 0, src & 0xFFFFFFFF, src >> 32, D, 0]
    _gpu_with_ring(d, _poll(src + 0x10000, 0x51000001, 3) + copy, run_ms=0)
    assert d.violations == []
    arm_out(d, 128, 0, 4)
    bulk_out(d, b"\x22" * 0x10000)  # the host rewrites the part while the GPU is still copying it
    d.wait(None, 10)
    assert d.sdma.bytes_copied == 0x10000
    assert any("host overwrote SRAM data the GPU had not copied yet" in v for v in d.violations)


def test_transfer_faults_report_the_injected_status() -> None:
    from speck.usbgpu.sim.config import TransferFault

    for mode, status in (
        ("error", TransferStatus.ERROR),
        ("stall", TransferStatus.STALL),
        ("short", TransferStatus.COMPLETED),
        ("timeout", TransferStatus.TIMED_OUT),
    ):
        d = SimDevice()
        d.inject(TransferFault(0x02, 1, mode))
        arm_out(d, 8, 0, 1)
        res = bulk_out(d, bytes(4096), timeout_ms=30)
        assert res.status == status and res.actual_length == 2048, mode
    d = SimDevice(faults=SimFaults(disconnect_after_out_bytes=1024))
    arm_out(d, 8, 0, 1)
    assert bulk_out(d, bytes(4096)).status == TransferStatus.NO_DEVICE and not d.connected


def test_disconnect_during_a_blocked_f4_leaves_a_usable_device_after_reconnect() -> None:
    d = SimDevice()
    tid = d.submit("control", 0, struct.pack("<BBHHH", 0xC0, 0xF4, 0x0BE2, 0x9010, 32), b"", 32, 30000)
    assert d.wait([tid], 50) == []  # blocked waiting for the GPU
    d.disconnect()
    assert dict(d.wait([tid], 0))[tid].status == TransferStatus.NO_DEVICE
    d.reconnect()
    res = ctrl(d, 0xC0, 0xE4, 0xB450, 0, length=1)
    assert res.status == TransferStatus.COMPLETED and d.dma.current is None
    d.wait(None, 5000)  # the stale 0xF4 bail timer must not arm or reply to anything
    assert d.dma.current is None and d.stats["f4_bails"] == 0


def test_config_and_memory_routing_need_the_bridges_set_up() -> None:
    d = SimDevice()

    def cfg_read(bus: int, reg: int) -> bytes:
        fmt = 0x04 if bus == 0 else 0x05
        ctrl(d, 0x40, 0xF0, fmt | 0xF << 8, 0, struct.pack("<III", bus << 24 | reg, 0, 0))
        return ctrl(d, 0xC0, 0xF0, 0, 0, length=8).data

    assert cfg_read(0, 0)[:4] == struct.pack("<I", 0x2464 << 16 | 0x1B21)  # bus 0 always answers
    assert cfg_read(4, 0)[4] >> 5 == 1  # the GPU is unreachable before bridges 0..3 forward bus 4: UR
    for bus in range(4):
        fmt = 0x44 if bus == 0 else 0x45
        ctrl(d, 0x40, 0xF0, fmt | 0xF << 8, 0, struct.pack("<III", bus << 24 | 0x18, 0, (bus + 1) << 8 | 4 << 16))
    reply = cfg_read(4, 0)
    assert reply[4] >> 5 == 0 and reply[6] & 1 and reply[:4] == struct.pack("<I", 0x744C << 16 | 0x1002)
    # a memory write before any window/BAR is set up goes nowhere and is flagged
    ctrl(d, 0x40, 0xF0, 0x60 | 0xF << 8, 0, struct.pack("<III", 0, 8, 0x1234))
    assert any("reached no GPU BAR" in v for v in d.violations)


def test_e4_reply_is_capped_at_the_superspeed_ep0_buffer() -> None:
    d = SimDevice()
    res = ctrl(d, 0xC0, 0xE4, 0xF000, 0, length=600)
    assert res.status == TransferStatus.COMPLETED and len(res.data) == 512


def test_misrouting_without_nak_swallows_the_whole_transfer() -> None:
    d = SimDevice(faults=SimFaults(misroute_nak=False))
    res = bulk_out(d, bytes(64 * 1024))
    assert res.status == TransferStatus.COMPLETED and res.actual_length == 64 * 1024
    assert d.stats["misrouted_packets"] == 64 and len(d.violations) == 64
