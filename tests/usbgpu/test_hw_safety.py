"""Hardware safety: `info` only reads; the SDMA queue registers are the simulator profile's and are never written to a
GPU without that profile; on such a GPU (a simulator made to look like real hardware) the copy paths refuse."""

from __future__ import annotations

import pytest

from speck.usbgpu.__main__ import main
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import GpuBringUpNotImplemented
from speck.usbgpu.gpu import GPU_PROFILES, SIM_PROFILE, SIM_SUBSYSTEM
from speck.usbgpu.sim import HARDWARE_LIKE_SUBSYSTEM, default_devices
from speck.usbgpu.sim import config as simcfg
from speck.usbgpu.sim.device import SimDevice

WRITES = ("xdata_writes", "tlp_writes", "stream_writes", "arms", "power_requests", "mmio_writes", "doorbells")


def writes(dev: SimDevice) -> dict[str, int]:
    """The device's counters of requests that change its state."""
    return {k: dev.stats[k] for k in WRITES}


def test_the_driver_and_the_simulator_agree_on_the_simulator_profile() -> None:
    q = SIM_PROFILE.queue
    assert SIM_SUBSYSTEM == simcfg.SIM_GPU_SUBSYSTEM and SIM_PROFILE.sys_aperture == simcfg.GPU_SYS_APERTURE
    assert (q.gpu_id, q.rb_base_lo, q.rb_base_hi, q.rb_cntl) == (
        simcfg.MMIO_ID,
        simcfg.MMIO_SDMA_RB_BASE_LO,
        simcfg.MMIO_SDMA_RB_BASE_HI,
        simcfg.MMIO_SDMA_RB_CNTL,
    )
    assert (q.rptr_addr_lo, q.rptr_addr_hi, q.wptr_addr_lo, q.wptr_addr_hi, q.doorbell, q.status) == (
        simcfg.MMIO_SDMA_RPTR_ADDR_LO,
        simcfg.MMIO_SDMA_RPTR_ADDR_HI,
        simcfg.MMIO_SDMA_WPTR_ADDR_LO,
        simcfg.MMIO_SDMA_WPTR_ADDR_HI,
        simcfg.MMIO_SDMA_DOORBELL,
        simcfg.MMIO_SDMA_STATUS,
    )
    assert list(GPU_PROFILES.values()) == [SIM_PROFILE]  # no real GPU has a profile: bring-up is not implemented


def test_a_gpu_without_a_profile_gets_link_and_bars_only_and_copies_refuse() -> None:
    dev = SimDevice(gpu_subsystem=HARDWARE_LIKE_SUBSYSTEM)  # looks like a real board to the driver
    with UsbGpu.open(sim=dev) as gpu:
        assert gpu.context.profile is None and gpu.context.ltssm == 0x78 and 0 in gpu.context.pcie.bars
        buf = gpu.alloc(4096)  # host bookkeeping only
        for call in (
            lambda: gpu.copyin(buf, b"x" * 4096),
            lambda: gpu.copyin_async(buf, b"x"),
            lambda: gpu.copyout(bytearray(16), buf),
            lambda: gpu.copyout_async(bytearray(16), buf),
            gpu.context.gpu_id,
        ):
            with pytest.raises(GpuBringUpNotImplemented, match="GPU bring-up not implemented for GPU 1002:744c") as e:
                call()
            assert "subsystem 1002:0e3b" in str(e.value) and "simulator" in str(e.value)
        gpu.free(buf)
        gpu.synchronize()  # refusing did not break the session
    assert dev.stats["mmio_writes"] == 0 and dev.mmio == {}  # BAR5 never written
    assert dev.stats["stream_writes"] == 0 and dev.stats["doorbells"] == 0 and dev.stats["arms"] == 0
    assert dev.violations == []


def test_a_profiled_gpu_is_programmed_through_bar5() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        assert gpu.context.profile is SIM_PROFILE
    assert dev.stats["mmio_writes"] > 0 and dev.sdma.enabled


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
    assert "profile   speck-sim (copies supported)" in out and "ReBAR     BAR0 is 8192 MiB" in out
    for reg, index in ((0x10, 0), (0x18, 2), (0x24, 5)):
        assert f"BAR{index}      {dev.fabric.gpu.bar_address(reg):#014x}" in out


def test_info_on_a_fresh_device_reports_the_link_down_without_powering_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--sim"]) == 0
    out = capsys.readouterr().out
    assert "LTSSM 0x01 (down)" in out and "the PCIe link is down (UsbGpu.open brings it up)" in out
    from speck.usbgpu.sim import shim

    (dev,) = shim.installed_models()
    assert isinstance(dev, SimDevice) and writes(dev) == dict.fromkeys(WRITES, 0)


def test_info_on_a_gpu_without_a_profile_says_copies_are_refused(
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
    assert "subsystem 1002:0e3b" in out and "profile   none: GPU bring-up is not implemented" in out
    assert "BAR0" in out and "BAR5" in out
