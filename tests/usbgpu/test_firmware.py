"""Firmware: the file formats of amdgpu_ucode.h read and written (synthetic files with valid headers), bad files named,
loading through the simulated PSP (bootloader, ring, TMR, one LOAD_IP_FW per image, RLC autoload, the SMU's answer),
and the engines refusing to run without their firmware."""

from __future__ import annotations

import pathlib
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simgpu import DirectBus
from speck.usbgpu.amd import ucode
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.tables import CONST, GC, MP
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import GpuBringUpError
from speck.usbgpu.sim.device import SimDevice

blobs = st.binary(min_size=1, max_size=3000)


@settings(max_examples=25)
@given(blobs, blobs, blobs, blobs)
def test_every_kind_of_file_round_trips(a: bytes, b: bytes, c: bytes, d: bytes) -> None:
    assert [(i.kind, i.data) for i in ucode.parse_gfx_rs64("mec", ucode.build_gfx_rs64(a, b), 1, 2)] == [(1, a), (2, b)]
    sdma = ucode.parse_sdma("sdma", ucode.build_sdma(c, d))
    assert [(i.kind, i.data) for i in sdma] == [
        (CONST.GFX_FW_TYPE_SDMA_UCODE_TH0, c),
        (CONST.GFX_FW_TYPE_SDMA_UCODE_TH1, d),
    ]
    imu = ucode.parse_imu("imu", ucode.build_imu(a, d))
    assert [(i.kind, i.data) for i in imu] == [(CONST.GFX_FW_TYPE_IMU_I, a), (CONST.GFX_FW_TYPE_IMU_D, d)]
    assert ucode.parse_rlc("rlc", ucode.build_rlc(b))[0].data == b
    assert ucode.parse_smc("smu", ucode.build_smc(c))[0].data == c
    parts = {CONST.PSP_FW_TYPE_PSP_SYS_DRV: a, CONST.PSP_FW_TYPE_PSP_SOS: b, CONST.PSP_FW_TYPE_PSP_KDB: c}
    boot = ucode.parse_psp_sos("sos", ucode.build_psp_sos(parts))
    assert [(i.kind, i.data) for i in boot] == [
        (CONST.PSP_BL__LOAD_KEY_DATABASE, c),
        (CONST.PSP_BL__LOAD_SYSDRV, a),
        (CONST.PSP_BL__LOAD_SOSDRV, b),
    ]


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda f: f[:40], "shorter than its gfx_firmware_header_v2_0"),
        (lambda f: f + b"\0", "the header says"),
        (lambda f: f[:300] + bytes([f[300] ^ 1]) + f[301:], "CRC32 does not match"),
        (lambda f: f[:8] + b"\x07" + f[9:], "header version 7"),
    ],
)
def test_a_bad_file_is_named(damage: object, match: str) -> None:
    good = ucode.build_gfx_rs64(b"c" * 512, b"d" * 256)
    with pytest.raises(GpuBringUpError, match=f"firmware gc_11_0_0_mec.bin failed: .*{match}"):
        ucode.parse_gfx_rs64("gc_11_0_0_mec.bin", damage(good), 1, 2)  # type: ignore[operator]


def test_missing_files_name_the_files_and_the_package(tmp_path: pathlib.Path) -> None:
    files = ucode.synthetic_files()
    del files["sdma_6_0_0.bin"]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(GpuBringUpError, match=r"sdma_6_0_0\.bin not found in .*firmware-amd-graphics"):
        ucode.load(tmp_path)


def test_firmware_loads_from_a_directory(tmp_path: pathlib.Path) -> None:
    dev = SimDevice()
    for name, data in dev.firmware_files().items():
        (tmp_path / name).write_bytes(data)
    with UsbGpu.open(sim=dev, firmware=tmp_path) as gpu:
        assert "firmware" in gpu.context.steps
    assert dev.gpu.psp.rlc_autoloaded and dev.violations == []


def test_the_psp_refuses_images_that_are_not_the_cards() -> None:
    dev = SimDevice()
    wrong = dev.firmware_files()
    wrong["sdma_6_0_0.bin"] = ucode.synthetic_files(seed=1)["sdma_6_0_0.bin"]  # valid headers, another payload
    with pytest.raises(GpuBringUpError, match=r"loading sdma_6_0_0.bin .type 0x47. failed: the PSP refused command"):
        UsbGpu.open(sim=dev, firmware=wrong)
    assert any("PSP refused firmware type 0x47" in v for v in dev.violations)
    wrong = ucode.synthetic_files(seed=1)  # the secure OS too: it never starts
    with pytest.raises(
        GpuBringUpError, match=r"PSP secure OS start failed: the PSP did not answer \(MP0_SMN_C2PMSG_81"
    ):
        UsbGpu.open(sim=SimDevice(), firmware=wrong)


def test_a_second_session_finds_the_secure_os_running_and_reloads_the_rest() -> None:
    dev = SimDevice()
    with UsbGpu.open(sim=dev):
        pass
    boots = dict(dev.gpu.psp.boot_parts)
    with UsbGpu.open(sim=dev) as gpu:
        buf = gpu.alloc(64)
        gpu.copyin(buf, b"q" * 64)
    assert dev.gpu.psp.boot_parts == boots and dev.violations == []  # the bootloader was not asked again


def test_without_smu_firmware_a_silent_smu_is_named() -> None:
    dev = SimDevice()
    files = dev.firmware_files()
    del files[ucode.SMU_FILE]
    with pytest.raises(GpuBringUpError, match="SMU check failed: the SMU did not answer its test message"):
        UsbGpu.open(sim=dev, firmware=files)


# ---------------------------------------------------------------- what the model refuses, without USB
def _mmio(dev: SimDevice) -> Mmio:
    return Mmio(DirectBus(dev), 0, 1 << 20, dev.gpu.regs.bases)


def test_engines_do_not_leave_halt_without_their_firmware() -> None:
    dev = SimDevice()
    m = _mmio(dev)
    m.update(GC.SDMA0_F32_CNTL, HALT=0)
    m.update(GC.CP_MEC_RS64_CNTL, MEC_HALT=0)
    assert m.field(GC.SDMA0_F32_CNTL, "HALT") == 1 and m.field(GC.CP_MEC_RS64_CNTL, "MEC_HALT") == 1
    refused = " / ".join(dev.gpu.psp.gpu.refused)
    assert "SDMA0 released from halt without its firmware" in refused and "MEC released from halt" in refused
    assert refused.count("bring-up step 'firmware'") == 2


def test_the_psp_ring_needs_the_secure_os() -> None:
    dev = SimDevice()
    m = _mmio(dev)
    assert m.read(MP.MP0_SMN_C2PMSG_81) == 0  # at power-on only the bootloader runs
    m.write(MP.MP0_SMN_C2PMSG_64, CONST.PSP_RING_TYPE__KM << 16)
    assert m.read(MP.MP0_SMN_C2PMSG_64) & 0xFFFF  # answered with an error status
    assert any("before the secure OS runs" in v for v in dev.violations)


def test_synthetic_payloads_carry_their_crc() -> None:
    f = ucode.build_rlc(b"payload")
    common = ucode.STRUCTS.common_firmware_header.unpack(f)
    start = common["ucode_array_offset_bytes"]
    assert common["crc32"] == zlib.crc32(f[start : start + common["ucode_size_bytes"]])
