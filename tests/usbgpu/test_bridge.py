"""speck.usbgpu.bridge against the simulator through the real transport: xdata, TLPs, BAR setup, arms, 0xF4."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.bridge import Bridge, f4_reached, pack_f4
from speck.usbgpu.errors import TlpCompletionError
from speck.usbgpu.sim.device import SimDevice

_CACHE: list[tuple[UsbGpu, SimDevice]] = []


@pytest.fixture(scope="module", autouse=True)
def _close_cached_session() -> Iterator[None]:
    """Close the shared session when the module is done (other modules count open handles)."""
    yield
    while _CACHE:
        _CACHE.pop()[0].close()


@pytest.fixture
def gpu_dev() -> Iterator[tuple[UsbGpu, SimDevice]]:
    from speck.usbgpu.sim import shim

    if not _CACHE or not any(m is _CACHE[0][1] for m in shim.installed_models()):
        if _CACHE:
            _CACHE.pop()[0].close()
        dev = SimDevice()
        _CACHE.append((UsbGpu.open(sim=dev), dev))
    yield _CACHE[0]


def test_f4_packing_matches_the_documented_example() -> None:
    assert pack_f4(482, 16, 16, 1, 5) == (0x0BE2, 0x9010)
    assert pack_f4(482, 0, 16, 0, 0x85) == (0x1E2 | (0x05 << 9), 0 | 16 << 8 | 1 << 14)
    with pytest.raises(ValueError, match="1..511"):
        pack_f4(512, 0, 16, 0, 1)


@given(
    sectors=st.integers(1, 511),
    slot=st.integers(0, 31),
    nslots=st.integers(1, 63),
    buf=st.integers(0, 1),
    target=st.integers(0, 255),
)
def test_f4_packing_roundtrips_through_the_simulators_decoder(
    sectors: int, slot: int, nslots: int, buf: int, target: int
) -> None:
    value, index = pack_f4(sectors, slot, nslots, buf, target)
    assert SimDevice.decode_f4(value, index) == (sectors, slot, nslots, buf, target)


def test_f4_reply_check_accepts_either_flag_in_a_modular_window() -> None:
    flags = bytearray(32)
    flags[8] = 4  # buffer 1 full flag
    assert not f4_reached(bytes(flags), 1, 5)
    flags[24] = 5  # buffer 1 first-part flag
    assert f4_reached(bytes(flags), 1, 5)
    flags = bytearray(32)
    flags[0] = 2  # wrapped past 255
    assert f4_reached(bytes(flags), 0, 250) and not f4_reached(bytes(flags), 0, 3)


def test_xdata_reads_are_split_into_0xff_byte_requests(gpu_dev: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = gpu_dev
    bridge = gpu.context.bridge
    dev.mem.sram[:600] = bytes(i * 7 & 0xFF for i in range(600))
    before = dev.stats["control_transfers"]
    assert bridge.xdata_read(0xF000, 600) == bytes(dev.mem.sram[:600])
    assert dev.stats["control_transfers"] - before == 3
    bridge.xdata_write(0xA000, b"\x01\x02\x03")
    assert bytes(dev.mem.sq[:3]) == b"\x01\x02\x03"
    assert dev.stats["control_transfers"] - before == 6  # one 0xE5 per byte


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offset=st.integers(0, 4095), size=st.integers(1, 4), value=st.integers(0, 2**32 - 1))
def test_single_tlp_byte_enables_and_shifting(
    gpu_dev: tuple[UsbGpu, SimDevice], offset: int, size: int, value: int
) -> None:
    gpu, dev = gpu_dev
    if (offset & 3) + size > 4:
        offset &= ~3
    bridge, bar0 = gpu.context.bridge, gpu.context.vram_bar
    region = 0x7F000000
    dev.vram.write(region, bytes([0x5A]) * 4096)
    value &= (1 << (8 * size)) - 1
    bridge.tlp(0x60, bar0 + region + offset, value, size)
    expected = bytearray([0x5A]) * 4096
    expected[offset : offset + size] = value.to_bytes(size, "little")
    assert dev.read_vram(region, 4096) == expected  # only the enabled bytes changed
    assert bridge.tlp(0x20, bar0 + region + offset, 0, size) == value


def test_unclaimed_address_completes_with_unsupported_request(gpu_dev: tuple[UsbGpu, SimDevice]) -> None:
    gpu, _ = gpu_dev
    with pytest.raises(TlpCompletionError, match=r"Unsupported Request \(UR\)"):
        gpu.context.bridge.mem_read32(0x4000_0000)  # inside the bridge window but no BAR there
    with pytest.raises(TlpCompletionError, match="UR"):
        gpu.context.bridge.cfg_read(4, 0x00, dev=1)  # no device 1 on the GPU's bus


def test_bridge_and_bar_setup_places_bars_in_the_windows(gpu_dev: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = gpu_dev
    pcie = gpu.context.pcie
    assert (pcie.vendor, pcie.device) == (0x1002, 0x744C)
    bars = pcie.bars
    assert set(bars) == {0, 2, 5}
    assert bars[0].size == dev.vram.size == pcie.rebar_size  # ReBAR grew BAR0 to its largest size
    for bar in bars.values():
        assert bar.address % max(bar.size, 2 << 20) == 0
        if bar.prefetchable and bar.is64:
            assert bar.address >= 0x8_0000_0000
        else:
            assert 0x1000_0000 <= bar.address and bar.address + bar.size <= 1 << 32
    placed = sorted((b.address, b.address + max(b.size, 2 << 20)) for b in bars.values())
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(placed, placed[1:]))
    # the simulator agrees: config space holds exactly these addresses, and bus 4 is reachable
    assert dev.fabric.gpu.bar_address(0x10) == bars[0].address
    assert gpu.context.bridge.cfg_read(3, 0x18) >> 8 & 0xFF == 4


def test_stream_write_and_read_roundtrip_through_bar0(gpu_dev: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = gpu_dev
    bridge, bar0 = gpu.context.bridge, gpu.context.vram_bar
    data = bytes(range(256)) * 9
    bridge.stream_write(bar0 + 0x7E000000, data)
    assert dev.read_vram(0x7E000000, len(data)) == data
    assert bridge.stream_read(bar0 + 0x7E000000, len(data)) == data
    with pytest.raises(ValueError, match="multiple of 4"):
        bridge.stream_write(bar0, b"abc")


def test_link_bring_up_uses_f3_only_when_needed() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        assert gpu.context.ltssm == 0x78
        bridge: Bridge = gpu.context.bridge
        before = dev.stats["control_transfers"]
        bridge.ensure_link()  # already up: one 0xE4 read, no 0xF3
        assert dev.stats["control_transfers"] - before == 1


def test_registers_are_read_through_bar5_at_the_discovery_table_addresses(gpu_dev: tuple[UsbGpu, SimDevice]) -> None:
    """The SDMA ring control the driver programmed reads back through BAR5 at (IP base + offset) * 4, the bases
    coming from the card's discovery table; the model holds it at the same register."""
    from speck.usbgpu.amd.tables import GC

    gpu, dev = gpu_dev
    reg = GC.SDMA0_QUEUE0_RB_CNTL
    value = gpu.context.mmio.read(reg)
    assert reg.get(value, "RB_ENABLE") == 1 and reg.get(value, "RB_VMID") == 1
    base = gpu.context.discovery.bases()["GC"][reg.base_idx]
    assert gpu.context.mmio.address(reg) == 4 * (base + reg.offset)
    assert dev.gpu.regs.get(reg) == value
