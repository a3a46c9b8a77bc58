"""AMD firmware files (amdgpu_ucode.h): which ones speck's path needs on a GC 11.0.0 card, how each is laid out, and
what goes to the PSP from it - every file is a common header (size, header size, versions, the payload's size and
offset, a CRC32 of the payload) followed by a header of its kind naming the images inside.

Files are read from /lib/firmware/amdgpu (or wherever the caller points); `build_*` make synthetic files with valid
headers (the simulator ships a set, and the tests use them).
"""

from __future__ import annotations

import os
import pathlib
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from speck.usbgpu.amd.regdefs import Struct
from speck.usbgpu.amd.tables import CONST, STRUCTS
from speck.usbgpu.errors import GpuBringUpError

FIRMWARE_DIR = pathlib.Path("/lib/firmware/amdgpu")
_COMMON = STRUCTS.common_firmware_header


@dataclass(frozen=True)
class Image:
    """One payload for the PSP: its GFX_FW_TYPE_* (or, for the bootloader, PSP_BL__* command) and bytes."""

    kind: int
    data: bytes
    name: str


@dataclass(frozen=True)
class FirmwareSet:
    """The bootloader components of the PSP's SOS file, and the images loaded through the PSP ring, in order."""

    bootloader: tuple[Image, ...]
    images: tuple[Image, ...]
    smu: bool  # the set includes the SMU's firmware (it answers its mailbox once loaded)


def _fail(name: str, detail: str) -> GpuBringUpError:
    return GpuBringUpError(f"firmware {name}", detail, "use the file linux-firmware ships for this card")


def _common(name: str, blob: bytes, header: Struct, major: int) -> dict[str, Any]:
    if len(blob) < header.size:
        raise _fail(name, f"{len(blob)} bytes is shorter than its {header.name} ({header.size} bytes)")
    fields = header.unpack(blob)
    common = fields["header"] if "header" in fields else fields
    assert isinstance(common, dict)
    if common["size_bytes"] != len(blob):
        raise _fail(name, f"the header says {common['size_bytes']} bytes, the file has {len(blob)}")
    if common["header_version_major"] != major:
        raise _fail(name, f"header version {common['header_version_major']}, speck reads {header.name}")
    start, size = common["ucode_array_offset_bytes"], common["ucode_size_bytes"]
    assert isinstance(start, int) and isinstance(size, int)
    if start + size > len(blob):
        raise _fail(name, f"its payload [{start}, +{size}) runs past the end of the file")
    crc = common["crc32"]
    if crc and zlib.crc32(blob[start : start + size]) != crc:
        raise _fail(name, "the payload's CRC32 does not match its header")
    return fields


def _slice(name: str, blob: bytes, start: int, size: int, what: str) -> bytes:
    if start + size > len(blob) or size <= 0:
        raise _fail(name, f"its {what} [{start}, +{size}) is empty or runs past the end of the file")
    return blob[start : start + size]


def parse_gfx_rs64(name: str, blob: bytes, ucode_type: int, stack_type: int) -> list[Image]:
    """gfx_firmware_header_v2_0 (an RS64 microengine): the instructions, then the data (stack) image."""
    f = _common(name, blob, STRUCTS.gfx_firmware_header_v2_0, 2)
    code = _slice(name, blob, f["ucode_offset_bytes"], f["ucode_size_bytes"], "ucode")
    data = _slice(name, blob, f["data_offset_bytes"], f["data_size_bytes"], "data")
    return [Image(ucode_type, code, name), Image(stack_type, data, name + " stack")]


def parse_sdma(name: str, blob: bytes) -> list[Image]:
    """sdma_firmware_header_v2_0: the context thread (TH0) and control thread (TH1) images."""
    f = _common(name, blob, STRUCTS.sdma_firmware_header_v2_0, 2)
    common = f["header"]
    assert isinstance(common, dict)
    ctx = _slice(name, blob, common["ucode_array_offset_bytes"], f["ctx_ucode_size_bytes"], "context thread")
    ctl = _slice(name, blob, f["ctl_ucode_offset"], f["ctl_ucode_size_bytes"], "control thread")
    return [Image(CONST.GFX_FW_TYPE_SDMA_UCODE_TH0, ctx, name), Image(CONST.GFX_FW_TYPE_SDMA_UCODE_TH1, ctl, name)]


def parse_imu(name: str, blob: bytes) -> list[Image]:
    """imu_firmware_header_v1_0: instruction RAM and data RAM images."""
    f = _common(name, blob, STRUCTS.imu_firmware_header_v1_0, 1)
    iram = _slice(name, blob, f["imu_iram_ucode_offset_bytes"], f["imu_iram_ucode_size_bytes"], "IRAM")
    dram = _slice(name, blob, f["imu_dram_ucode_offset_bytes"], f["imu_dram_ucode_size_bytes"], "DRAM")
    return [Image(CONST.GFX_FW_TYPE_IMU_I, iram, name), Image(CONST.GFX_FW_TYPE_IMU_D, dram, name)]


def _payload(name: str, blob: bytes, header: Struct, major: int, kind: int) -> list[Image]:
    f = _common(name, blob, header, major)
    common = f["header"]
    assert isinstance(common, dict)
    data = _slice(name, blob, common["ucode_array_offset_bytes"], common["ucode_size_bytes"], "ucode")
    return [Image(kind, data, name)]


def parse_rlc(name: str, blob: bytes) -> list[Image]:
    return _payload(name, blob, STRUCTS.rlc_firmware_header_v2_0, 2, CONST.GFX_FW_TYPE_RLC_G)


def parse_smc(name: str, blob: bytes) -> list[Image]:
    """smc_firmware_header_v1_0 / v2_x (the v2 headers extend v1): the SMU's firmware, loaded by the PSP."""
    f = STRUCTS.smc_firmware_header_v1_0.unpack(blob) if len(blob) >= STRUCTS.smc_firmware_header_v1_0.size else {}
    major = f.get("header", {}).get("header_version_major", 0) if f else 0
    return _payload(
        name, blob, STRUCTS.smc_firmware_header_v1_0, major if major in (1, 2) else 1, CONST.GFX_FW_TYPE_SMU
    )


_BOOTLOADER_ORDER = (  # PSP firmware part -> bootloader command, in the order psp_hw_start loads them
    (CONST.PSP_FW_TYPE_PSP_KDB, CONST.PSP_BL__LOAD_KEY_DATABASE),
    (CONST.PSP_FW_TYPE_PSP_SPL, CONST.PSP_BL__LOAD_TOS_SPL_TABLE),
    (CONST.PSP_FW_TYPE_PSP_SYS_DRV, CONST.PSP_BL__LOAD_SYSDRV),
    (CONST.PSP_FW_TYPE_PSP_SOS, CONST.PSP_BL__LOAD_SOSDRV),
)


def parse_psp_sos(name: str, blob: bytes) -> list[Image]:
    """psp_firmware_header_v2_0: a table of parts (key database, SPL, system driver, secure OS) the bootloader
    loads, returned as bootloader commands (Image.kind = PSP_BL__*)."""
    f = _common(name, blob, STRUCTS.psp_firmware_header_v2_0, 2)
    count = f["psp_fw_bin_count"]
    assert isinstance(count, int)
    desc = STRUCTS.psp_fw_bin_desc
    base = STRUCTS.psp_firmware_header_v2_0.offset("psp_fw_bin")
    common = f["header"]
    assert isinstance(common, dict)
    parts: dict[int, bytes] = {}
    for i in range(count):
        d = desc.unpack(blob, base + i * desc.size) if base + (i + 1) * desc.size <= len(blob) else None
        if d is None:
            raise _fail(name, f"part {i} of {count} runs past the end of the file")
        start = common["ucode_array_offset_bytes"] + d["offset_bytes"]
        parts[d["fw_type"]] = _slice(name, blob, start, d["size_bytes"], f"part {d['fw_type']}")
    if CONST.PSP_FW_TYPE_PSP_SOS not in parts or CONST.PSP_FW_TYPE_PSP_SYS_DRV not in parts:
        raise _fail(name, "it has no system driver or secure OS part")
    return [Image(cmd, parts[part], name) for part, cmd in _BOOTLOADER_ORDER if part in parts]


# The files speck's path needs on GC 11.0.0 (amdgpu's names: <ip>_<major>_<minor>_<rev>[_<part>].bin) and how each
# is read. The SMU's file is optional: a card whose SMU firmware already runs (its mailbox answers) needs none.
REQUIRED: dict[str, Callable[[str, bytes], list[Image]]] = {
    "gc_11_0_0_imu.bin": parse_imu,
    "gc_11_0_0_rlc.bin": parse_rlc,
    "gc_11_0_0_mec.bin": lambda n, b: parse_gfx_rs64(
        n, b, CONST.GFX_FW_TYPE_RS64_MEC, CONST.GFX_FW_TYPE_RS64_MEC_P0_STACK
    ),
    "sdma_6_0_0.bin": parse_sdma,
}
SOS_FILE = "psp_13_0_0_sos.bin"
SMU_FILE = "smu_13_0_0.bin"


def load(source: str | os.PathLike[str] | Mapping[str, bytes] | None = None) -> FirmwareSet:
    """Read and check the firmware from `source`: a directory (default /lib/firmware/amdgpu) or {file: bytes}."""
    if source is None or not isinstance(source, Mapping):
        folder = pathlib.Path(source) if source is not None else FIRMWARE_DIR

        def read(name: str) -> bytes | None:
            path = folder / name
            return path.read_bytes() if path.is_file() else None

        where = str(folder)
    else:
        files = source

        def read(name: str) -> bytes | None:
            return files.get(name)

        where = "the firmware mapping given"
    missing = [n for n in (*REQUIRED, SOS_FILE) if read(n) is None]
    if missing:
        raise GpuBringUpError(
            "firmware loading",
            f"{', '.join(missing)} not found in {where}",
            "install the linux-firmware package (Debian: firmware-amd-graphics), or pass UsbGpu.open(firmware=...) "
            "a directory holding AMD's files",
        )
    images: list[Image] = []
    smu = read(SMU_FILE)
    if smu is not None:
        images += parse_smc(SMU_FILE, smu)
    for name, parse in REQUIRED.items():
        blob = read(name)
        assert blob is not None
        images += parse(name, blob)
    sos = read(SOS_FILE)
    assert sos is not None
    return FirmwareSet(tuple(parse_psp_sos(SOS_FILE, sos)), tuple(images), smu is not None)


# ---------------------------------------------------------------------------------------------------- synthetic
def _build(header: Struct, major: int, fields: dict[str, object], parts: list[bytes]) -> bytes:
    """A file of `header` followed by `parts`; the common header describes the first part."""
    offsets, pos = [], header.size
    for p in parts:
        pos = -(-pos // 256) * 256
        offsets.append(pos)
        pos += len(p)
    blob = bytearray(pos)
    for off, p in zip(offsets, parts):
        blob[off : off + len(p)] = p
    common = {
        "size_bytes": len(blob),
        "header_size_bytes": header.size,
        "header_version_major": major,
        "header_version_minor": 0,
        "ucode_size_bytes": len(parts[0]),
        "ucode_array_offset_bytes": offsets[0],
        "crc32": zlib.crc32(parts[0]),
    }
    values = {k: (v(offsets) if callable(v) else v) for k, v in fields.items()}
    if header is _COMMON:
        header.pack_into(blob, 0, **common)
    else:
        header.pack_into(blob, 0, header=common, **values)
    return bytes(blob)


def build_gfx_rs64(code: bytes, data: bytes) -> bytes:
    return _build(
        STRUCTS.gfx_firmware_header_v2_0,
        2,
        {
            "ucode_size_bytes": len(code),
            "ucode_offset_bytes": lambda o: o[0],
            "data_size_bytes": len(data),
            "data_offset_bytes": lambda o: o[1],
        },
        [code, data],
    )


def build_sdma(ctx: bytes, ctl: bytes) -> bytes:
    return _build(
        STRUCTS.sdma_firmware_header_v2_0,
        2,
        {
            "ctx_ucode_size_bytes": len(ctx),
            "ctl_ucode_offset": lambda o: o[1],
            "ctl_ucode_size_bytes": len(ctl),
        },
        [ctx, ctl],
    )


def build_imu(iram: bytes, dram: bytes) -> bytes:
    return _build(
        STRUCTS.imu_firmware_header_v1_0,
        1,
        {
            "imu_iram_ucode_size_bytes": len(iram),
            "imu_iram_ucode_offset_bytes": lambda o: o[0],
            "imu_dram_ucode_size_bytes": len(dram),
            "imu_dram_ucode_offset_bytes": lambda o: o[1],
        },
        [iram, dram],
    )


def build_rlc(code: bytes) -> bytes:
    return _build(STRUCTS.rlc_firmware_header_v2_0, 2, {}, [code])


def build_smc(code: bytes) -> bytes:
    return _build(STRUCTS.smc_firmware_header_v1_0, 1, {}, [code])


def build_psp_sos(parts: Mapping[int, bytes]) -> bytes:
    """A psp_firmware_header_v2_0 file with `parts` {PSP_FW_TYPE_*: bytes} (offsets relative to the first)."""
    kinds = list(parts)
    blobs = [parts[k] for k in kinds]
    desc = STRUCTS.psp_fw_bin_desc
    head = STRUCTS.psp_firmware_header_v2_0
    header_size = head.offset("psp_fw_bin") + desc.size * len(kinds)
    offsets, pos = [], header_size
    for b in blobs:
        pos = -(-pos // 256) * 256
        offsets.append(pos)
        pos += len(b)
    blob = bytearray(pos)
    common = {
        "size_bytes": len(blob),
        "header_size_bytes": header_size,
        "header_version_major": 2,
        "ucode_size_bytes": pos - offsets[0],
        "ucode_array_offset_bytes": offsets[0],
        "crc32": 0,
    }
    head.pack_into(blob, 0, header=common, psp_fw_bin_count=len(kinds))
    for i, (k, b, off) in enumerate(zip(kinds, blobs, offsets)):
        desc.pack_into(
            blob,
            head.offset("psp_fw_bin") + i * desc.size,
            fw_type=k,
            fw_version=1,
            offset_bytes=off - offsets[0],
            size_bytes=len(b),
        )
        blob[off : off + len(b)] = b
    return bytes(blob)


def synthetic_files(seed: int = 0) -> dict[str, bytes]:
    """A complete set of firmware files with valid headers and made-up payloads (what speck's simulated card
    accepts; never a real card's firmware)."""

    def payload(tag: str, n: int = 1024) -> bytes:
        return (f"speck synthetic {tag} {seed} ".encode() * n)[:n]

    return {
        "gc_11_0_0_imu.bin": build_imu(payload("imu iram"), payload("imu dram", 512)),
        "gc_11_0_0_rlc.bin": build_rlc(payload("rlc")),
        "gc_11_0_0_mec.bin": build_gfx_rs64(payload("mec"), payload("mec stack", 512)),
        "sdma_6_0_0.bin": build_sdma(payload("sdma ctx"), payload("sdma ctl")),
        SMU_FILE: build_smc(payload("smu")),
        SOS_FILE: build_psp_sos(
            {
                CONST.PSP_FW_TYPE_PSP_KDB: payload("kdb", 256),
                CONST.PSP_FW_TYPE_PSP_SYS_DRV: payload("sys drv"),
                CONST.PSP_FW_TYPE_PSP_SOS: payload("sos"),
            }
        ),
    }
