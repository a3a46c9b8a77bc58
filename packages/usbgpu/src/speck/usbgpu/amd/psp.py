"""Firmware loading through the PSP (MP0 13.0, psp_v13_0.c / amdgpu_psp.c) and the SMU's mailbox check.

Bootloader: each part of the SOS file goes into a 1 MiB-aligned buffer whose MC address >> 20 is written to
C2PMSG_36, then its PSP_BL__* command to C2PMSG_35; bit 31 of C2PMSG_35 says the bootloader is ready again. Once
the secure OS runs, C2PMSG_81 is non-zero. Ring: the KM ring's MC address and size go to C2PMSG_69/70/71 and
GFX_CTRL_CMD_ID_INIT_GPCOM_RING to C2PMSG_64 (bit 31 = done). Commands: a psp_gfx_cmd_resp buffer, a
psp_gfx_rb_frame pointing at it with a fence, the new write pointer (dwords) in C2PMSG_67; the PSP writes the fence
value and the response status. TMR first (GFX_CMD_ID_SETUP_TMR), then one GFX_CMD_ID_LOAD_IP_FW per image, then
GFX_CMD_ID_AUTOLOAD_RLC. SMU: message in C2PMSG_66, argument in C2PMSG_82, response in C2PMSG_90.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.tables import CONST, MP, STRUCTS
from speck.usbgpu.amd.ucode import FirmwareSet, Image
from speck.usbgpu.errors import GpuBringUpError, GpuFenceTimeout

READY = 1 << 31  # C2PMSG_35 (bootloader) and C2PMSG_64 (ring control) answer with bit 31
RESPONSE_MASK = 0x8000FFFF  # C2PMSG_64: done bit and status
POLLS = 2000
_CMD = STRUCTS.psp_gfx_cmd_resp
_FRAME = STRUCTS.psp_gfx_rb_frame
FRAME_DWORDS = _FRAME.size // 4
TMR_BYTES = 4 << 20  # PSP_TMR_SIZE for a dGPU that is not Aldebaran


@dataclass(frozen=True)
class PspMemory:
    """VRAM the PSP works in (offsets; the PSP reaches them at MC address fb_base + offset)."""

    ring: int
    ring_bytes: int
    cmd: int
    fence: int
    fw_pri: int  # 1 MiB aligned, room for the largest image
    fw_pri_bytes: int
    tmr: int  # 1 MiB aligned


class Psp:
    def __init__(
        self,
        mmio: Mmio,
        mem: PspMemory,
        mc: Callable[[int], int],
        write_vram: Callable[[int, bytes], None],
        read_vram: Callable[[int, int], bytes],
    ) -> None:
        self.m, self.mem, self.mc = mmio, mem, mc
        self.write_vram, self.read_vram = write_vram, read_vram
        self.wptr = 0
        self.fence = 0
        self.loaded: list[str] = []

    def _wait(self, reg: object, done: Callable[[int], bool], what: str) -> int:
        try:
            return self.m.wait(reg, done, what, POLLS)  # type: ignore[arg-type]
        except GpuFenceTimeout as exc:
            raise GpuBringUpError(
                what, f"the PSP did not answer ({exc.libusb_message})", "power-cycle the card"
            ) from exc

    # ------------------------------------------------------------------ bootloader
    def sos_alive(self) -> bool:
        return self.m.read(MP.MP0_SMN_C2PMSG_81) != 0

    def bootload(self, parts: tuple[Image, ...]) -> None:
        """Hand the bootloader each part (key database, SPL, system driver, secure OS), then wait for the SOS."""
        for part in parts:
            if len(part.data) > self.mem.fw_pri_bytes:
                raise GpuBringUpError(f"PSP bootloader ({part.name})", f"a {len(part.data)}-byte part", "")
            self._wait(MP.MP0_SMN_C2PMSG_35, lambda v: bool(v & READY), "PSP bootloader ready")
            self.write_vram(self.mem.fw_pri, part.data)
            self.m.write(MP.MP0_SMN_C2PMSG_36, self.mc(self.mem.fw_pri) >> 20)
            self.m.write(MP.MP0_SMN_C2PMSG_35, part.kind)
            self._wait(MP.MP0_SMN_C2PMSG_35, lambda v: bool(v & READY), f"PSP bootloader command {part.kind:#x}")
        self._wait(MP.MP0_SMN_C2PMSG_81, bool, "PSP secure OS start")

    # ------------------------------------------------------------------ ring
    def ring_create(self) -> None:
        """Destroy a ring an earlier session left, then create the KM ring."""
        m, mem = self.m, self.mem
        self._wait(MP.MP0_SMN_C2PMSG_64, lambda v: bool(v & READY), "PSP ready for ring commands")
        m.write(MP.MP0_SMN_C2PMSG_64, CONST.GFX_CTRL_CMD_ID_DESTROY_RINGS)
        self._wait(MP.MP0_SMN_C2PMSG_64, lambda v: bool(v & READY), "PSP ring destroy")
        self.write_vram(mem.ring, bytes(mem.ring_bytes))
        ring = self.mc(mem.ring)
        m.write(MP.MP0_SMN_C2PMSG_69, ring & 0xFFFFFFFF)
        m.write(MP.MP0_SMN_C2PMSG_70, ring >> 32)
        m.write(MP.MP0_SMN_C2PMSG_71, mem.ring_bytes)
        m.write(MP.MP0_SMN_C2PMSG_64, CONST.PSP_RING_TYPE__KM << 16)
        status = self._wait(MP.MP0_SMN_C2PMSG_64, lambda v: bool(v & READY), "PSP ring create")
        if status & RESPONSE_MASK != READY:
            raise GpuBringUpError("PSP ring create", f"the PSP answered {status:#010x}", "")
        self.wptr = 0

    def command(self, cmd_id: int, what: str, **cmd: object) -> None:
        """Submit one GFX command and wait for its fence; a non-zero response status is an error."""
        mem = self.mem
        buf = _CMD.pack(buf_size=_CMD.size, buf_version=CONST.PSP_GFX_CMD_BUF_VERSION, cmd_id=cmd_id, cmd=cmd)
        self.write_vram(mem.cmd, bytes(buf))
        self.fence += 1
        self.write_vram(mem.fence, bytes(8))
        frame = _FRAME.pack(
            cmd_buf_addr_lo=self.mc(mem.cmd) & 0xFFFFFFFF,
            cmd_buf_addr_hi=self.mc(mem.cmd) >> 32,
            cmd_buf_size=_CMD.size,
            fence_addr_lo=self.mc(mem.fence) & 0xFFFFFFFF,
            fence_addr_hi=self.mc(mem.fence) >> 32,
            fence_value=self.fence,
        )
        ring_dwords = mem.ring_bytes // 4
        self.write_vram(mem.ring + 4 * (self.wptr % ring_dwords), bytes(frame))
        self.wptr = (self.wptr + FRAME_DWORDS) % ring_dwords
        self.m.write(MP.MP0_SMN_C2PMSG_67, self.wptr)
        for _ in range(POLLS):
            if int.from_bytes(self.read_vram(mem.fence, 4), "little") == self.fence:
                break
        else:
            raise GpuBringUpError(what, f"the PSP never signalled command {cmd_id:#x}", "power-cycle the card")
        status = _CMD.unpack(self.read_vram(mem.cmd, _CMD.size))["resp"]["status"]
        if status:
            raise GpuBringUpError(what, f"the PSP refused command {cmd_id:#x} with status {status:#x}", "")

    def setup_tmr(self) -> None:
        tmr = self.mc(self.mem.tmr)
        self.command(
            CONST.GFX_CMD_ID_SETUP_TMR,
            "PSP TMR setup",
            cmd_setup_tmr={
                "buf_phy_addr_lo": tmr & 0xFFFFFFFF,
                "buf_phy_addr_hi": tmr >> 32,
                "buf_size": TMR_BYTES,
            },
        )

    def load(self, image: Image) -> None:
        if len(image.data) > self.mem.fw_pri_bytes:
            raise GpuBringUpError(f"firmware {image.name}", f"{len(image.data)} bytes exceed the staging buffer", "")
        self.write_vram(self.mem.fw_pri, image.data)
        fw = self.mc(self.mem.fw_pri)
        self.command(
            CONST.GFX_CMD_ID_LOAD_IP_FW,
            f"loading {image.name} (type {image.kind:#x})",
            cmd_load_ip_fw={
                "fw_phy_addr_lo": fw & 0xFFFFFFFF,
                "fw_phy_addr_hi": fw >> 32,
                "fw_size": len(image.data),
                "fw_type": image.kind,
            },
        )
        self.loaded.append(f"{image.name}:{image.kind:#x}")

    def load_all(self, firmware: FirmwareSet) -> None:
        """Secure OS (if it is not running yet), ring, TMR, every image, then the RLC's autoload of the rest."""
        if not self.sos_alive():
            self.bootload(firmware.bootloader)
        self.ring_create()
        self.setup_tmr()
        for image in firmware.images:
            self.load(image)
        self.command(CONST.GFX_CMD_ID_AUTOLOAD_RLC, "RLC autoload")


def smu_alive(m: Mmio) -> None:
    """Send the SMU its test message; GpuBringUpError when it does not answer OK (its firmware is not running)."""
    m.write(MP.MP1_SMN_C2PMSG_90, 0)
    m.write(MP.MP1_SMN_C2PMSG_82, 0)
    m.write(MP.MP1_SMN_C2PMSG_66, CONST.PPSMC_MSG_TestMessage)
    try:
        answer = m.wait(MP.MP1_SMN_C2PMSG_90, bool, "SMU test message", POLLS)
    except GpuFenceTimeout as exc:
        raise GpuBringUpError(
            "SMU check", "the SMU did not answer its test message", "its firmware is not running"
        ) from exc
    if answer != CONST.PPSMC_Result_OK:
        raise GpuBringUpError("SMU check", f"the SMU answered its test message with {answer:#x}", "")
