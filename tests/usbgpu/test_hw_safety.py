"""Hardware safety: `info` only reads; the function behind the bridge is vetted (vendor, class, IP versions) before
anything is written to it; its BARs move only with memory decoding off; and on a board the bring-up was never
verified on (a simulator made to look like real hardware) nothing past the BARs is written unless the caller opts
in, while copies name the opt-in."""

from __future__ import annotations

import pytest

from speck.usbgpu.__main__ import main
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import GpuBringUpUnverified, GpuNotSupported
from speck.usbgpu.gpu import SIM_SUBSYSTEM, VERIFIED_BOARDS
from speck.usbgpu.sim import HARDWARE_LIKE_SUBSYSTEM, default_devices
from speck.usbgpu.sim import config as simcfg
from speck.usbgpu.sim.device import SimDevice

WRITES = ("xdata_writes", "tlp_writes", "stream_writes", "arms", "power_requests", "mmio_writes", "doorbells")


def writes(dev: SimDevice) -> dict[str, int]:
    """The device's counters of requests that change its state."""
    return {k: dev.stats[k] for k in WRITES}


def test_the_only_verified_board_is_the_simulator() -> None:
    assert SIM_SUBSYSTEM == simcfg.SIM_GPU_SUBSYSTEM
    assert list(VERIFIED_BOARDS) == [(simcfg.GPU_VENDOR, simcfg.GPU_DEVICE, SIM_SUBSYSTEM)]


def test_an_unverified_board_is_identified_and_left_alone_and_copies_name_the_opt_in() -> None:
    dev = SimDevice(gpu_subsystem=HARDWARE_LIKE_SUBSYSTEM)  # looks like a real board to the driver
    with UsbGpu.open(sim=dev) as gpu:
        ctx = gpu.context
        assert not ctx.ready and ctx.steps == ["pcie", "discovery"] and ctx.ltssm == 0x78
        assert ctx.discovery.find("GC") is not None and ctx.discovery.find("GC").version == (11, 0, 0)  # type: ignore[union-attr]
        buf = gpu.alloc(4096)  # host bookkeeping only
        for call in (
            lambda: gpu.copyin(buf, b"x" * 4096),
            lambda: gpu.copyin_async(buf, b"x"),
            lambda: gpu.copyout(bytearray(16), buf),
            lambda: gpu.copyout_async(bytearray(16), buf),
        ):
            with pytest.raises(GpuBringUpUnverified, match="GPU 1002:744c") as e:
                call()
            assert "subsystem 1002:0e3b" in str(e.value) and "unverified=True" in str(e.value)
            assert "SPECK_USBGPU_UNVERIFIED=1" in str(e.value) and "GC 11.0.0" in str(e.value)
        gpu.free(buf)
        gpu.synchronize()  # refusing did not break the session
    assert dev.stats["mmio_writes"] == 0 and dev.gpu.regs.writes == 0  # no register of the GPU was written
    assert dev.stats["stream_writes"] == 0 and dev.stats["doorbells"] == 0 and dev.stats["arms"] == 0
    assert dev.violations == []


@pytest.mark.parametrize("via_env", [False, True])
def test_the_opt_in_brings_an_unverified_board_up(via_env: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = SimDevice(gpu_subsystem=HARDWARE_LIKE_SUBSYSTEM)
    if via_env:
        monkeypatch.setenv("SPECK_USBGPU_UNVERIFIED", "1")
    with UsbGpu.open(sim=dev, unverified=None if via_env else True) as gpu:
        assert gpu.context.ready and gpu.context.steps[-1] == "compute queue"
        buf = gpu.alloc(5000)
        gpu.copyin(buf, b"y" * 5000)
        out = bytearray(5000)
        gpu.copyout(out, buf)
        assert out == b"y" * 5000
    assert dev.violations == []


def test_a_verified_board_is_brought_up_through_bar5() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        assert gpu.context.ready and gpu.context.steps == [
            "pcie",
            "discovery",
            "nbio",
            "gmc",
            "ih",
            "firmware",
            "sdma",
            "cp",
            "compute queue",
        ]
    assert dev.stats["mmio_writes"] > 0 and dev.sdma.enabled and not dev.sdma.halted
    psp = dev.gpu.psp
    assert psp.sos_alive and psp.rlc_autoloaded and psp.smu_running and dev.violations == []
    assert {0x47, 0x48, 0x59, 0x5E, 0x8, 0x44, 0x45, 0x12} == set(psp.loaded)  # GFX_FW_TYPE_* of the images


@pytest.mark.parametrize(
    ("ids", "class_code", "match"),
    [
        (0x5678 << 16 | 0x1234, 0x030000, "1234:5678 with class 030000"),  # not AMD
        (0x744C << 16 | 0x1002, 0x020000, "1002:744c with class 020000"),  # AMD, but a network controller
    ],
)
def test_a_function_that_is_not_an_amd_display_controller_is_refused_before_any_write(
    ids: int, class_code: int, match: str
) -> None:
    dev = SimDevice()
    dev.fabric.gpu.set_dword(0x00, ids)
    dev.fabric.gpu.set_dword(0x08, class_code << 8)
    with pytest.raises(GpuNotSupported, match=match) as e:
        UsbGpu.open(sim=dev)
    assert "wrote nothing to it" in str(e.value)
    assert dev.stats["gpu_config_writes"] == 0 and dev.stats["mmio_writes"] == 0


def test_a_card_with_other_ip_versions_is_refused_after_reading_only() -> None:
    ips = {
        "GC": (10, 3, 0),
        "SDMA0": (5, 2, 0),
        "MMHUB": (2, 1, 0),
        "NBIO": (3, 3, 0),
        "OSSSYS": (5, 0, 0),
        "MP0": (11, 0, 7),
        "MP1": (11, 0, 7),
    }
    dev = SimDevice(gpu_ips=ips)
    with pytest.raises(GpuNotSupported, match=r"GC is 10\.3\.0, speck.usbgpu drives GC 11\.0\.x") as e:
        UsbGpu.open(sim=dev)
    assert "IP blocks: GC 10.3.0, SDMA0 5.2.0" in str(e.value)
    assert dev.stats["mmio_writes"] == 0 and dev.gpu.regs.writes == 0


def test_bars_move_only_with_memory_decoding_off() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev):
        pass
    assert dev.violations == []  # the model flags a BAR or ReBAR write while the GPU decodes memory
    dev.fabric.gpu.set_dword(0x04, 0x2)  # decoding on
    assert "memory decoding on" in (dev.fabric.config_write(dev.fabric.gpu, 0x10, 0xFFFFFFFF, 0xF) or "")
    assert "memory decoding on" in (dev.fabric.config_write(dev.fabric.gpu, 0x108, 0, 0xF) or "")
    assert dev.fabric.config_write(dev.fabric.gpu, 0x04, 0x6, 0xF) is None  # the command register itself is fine


def test_info_only_reads(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    (dev,) = default_devices(1)
    with UsbGpu.open():  # the environment's device, brought up once
        pass
    before = writes(dev)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert writes(dev) == before
    assert "LTSSM 0x78 (up)" in out and "1002:744c on bus 4, subsystem 5eed:0051" in out
    assert "board     speck's simulated Navi 31 (bring-up verified" in out and "ReBAR     BAR0 is 8192 MiB" in out
    for reg, index in ((0x10, 0), (0x18, 2), (0x24, 5)):
        assert f"BAR{index}      {dev.fabric.gpu.bar_address(reg):#014x}" in out


def test_info_on_a_fresh_device_reports_the_link_down_without_powering_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--sim"]) == 0
    out = capsys.readouterr().out
    assert "LTSSM 0x01 (down)" in out and "the PCIe link is down (UsbGpu.open brings it up)" in out
    from speck.usbgpu.sim import shim

    (dev,) = shim.installed_models()
    assert isinstance(dev, SimDevice) and writes(dev) == dict.fromkeys(WRITES, 0)


def test_info_on_an_unverified_board_names_the_opt_in(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from speck.usbgpu import transport

    dev = SimDevice(gpu_subsystem=HARDWARE_LIKE_SUBSYSTEM)
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    monkeypatch.setattr(transport, "_default_sim_models", lambda count: [dev])
    with UsbGpu.open():
        pass
    before = writes(dev)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert writes(dev) == before
    assert "subsystem 1002:0e3b" in out and "board     unverified: bring-up runs only with" in out
    assert "BAR0" in out and "BAR5" in out
