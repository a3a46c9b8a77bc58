"""The simulated card's PSP (MP0) and SMU (MP1), as far as firmware loading goes (the driver side is amd/psp.py).

At power-on only the PSP's bootloader runs: it takes the key database, system driver and secure OS through
C2PMSG_35/36; with the secure OS up (C2PMSG_81 non-zero) the KM ring can be created and GFX commands run: SETUP_TMR,
LOAD_IP_FW (accepted only for the payloads of the card's firmware set - the simulator's stand-in for the PSP's
signature check - and only once a TMR exists), AUTOLOAD_RLC. The engines check what was loaded: SDMA0 does not leave
halt without its two thread images, the MEC not without its RS64 image and the RLC's autoload, the SMU does not
answer its mailbox without its firmware.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from speck.usbgpu.amd import ucode
from speck.usbgpu.amd.tables import CONST, MP, STRUCTS
from speck.usbgpu.sim.vm import VmFault

if TYPE_CHECKING:
    from speck.usbgpu.sim.gpu_services import GpuServices

READY = 1 << 31
_CMD = STRUCTS.psp_gfx_cmd_resp
_FRAME = STRUCTS.psp_gfx_rb_frame
STATUS_REFUSED = 0xFFFF000A  # TEE_ERROR_NOT_SUPPORTED (psp_gfx_if.h): what the model answers a refused command
SOS_VERSION = 0x00_0D_00_2E  # what C2PMSG_81 reads once the secure OS runs (any non-zero value)
SDMA_IMAGES = {CONST.GFX_FW_TYPE_SDMA_UCODE_TH0, CONST.GFX_FW_TYPE_SDMA_UCODE_TH1}
MEC_IMAGES = {CONST.GFX_FW_TYPE_RS64_MEC, CONST.GFX_FW_TYPE_RLC_G}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Psp:
    def __init__(self, gpu: GpuServices, files: dict[str, bytes]) -> None:
        self.gpu = gpu
        firmware = ucode.load(files)
        self.accepted = {(i.kind, digest(i.data)) for i in firmware.images}
        self.bootloadable = {(i.kind, i.data) for i in firmware.bootloader}
        self.boot_parts: dict[int, bytes] = {}
        self.sos_alive = False
        self.ring: tuple[int, int] | None = None  # (MC address, bytes)
        self.rptr = 0
        self.tmr: tuple[int, int] | None = None
        self.loaded: dict[int, str] = {}  # GFX_FW_TYPE -> sha256 of the payload
        self.rlc_autoloaded = False
        self.smu_running = False
        r = gpu.regs
        r.set(MP.MP0_SMN_C2PMSG_35, READY)
        r.set(MP.MP0_SMN_C2PMSG_64, READY)
        r.on_write(MP.MP0_SMN_C2PMSG_35, self._bootloader)
        r.on_write(MP.MP0_SMN_C2PMSG_64, self._ring_control)
        r.on_write(MP.MP0_SMN_C2PMSG_67, self._ring_wptr)
        r.on_write(MP.MP1_SMN_C2PMSG_66, self._smu_message)

    # --- memory at MC addresses (the PSP reaches VRAM through the MM hub's VMID 0) ---
    def _read(self, mc: int, n: int) -> bytes | None:
        try:
            return self.gpu.read(0, mc, n, hub="mm")
        except VmFault as fault:
            self.gpu.violation(f"PSP read dropped: {fault}")
            return None

    def _write(self, mc: int, data: bytes) -> None:
        self.gpu.write_mc(mc, data)

    # --- bootloader ---
    def _bootloader(self, new: int, old: int) -> None:
        regs = self.gpu.regs
        regs.set(MP.MP0_SMN_C2PMSG_35, new & ~READY)  # busy while it works
        mc = regs.get(MP.MP0_SMN_C2PMSG_36) << 20
        part = next((data for kind, data in self.bootloadable if kind == new), None)
        blob = self._read(mc, len(part)) if part is not None else None
        if part is None or blob != part:
            self.gpu.violation(f"PSP bootloader command {new:#x} with a buffer it does not accept (at MC {mc:#x})")
        else:
            self.boot_parts[new] = blob
            if new == CONST.PSP_BL__LOAD_SOSDRV:
                if CONST.PSP_BL__LOAD_SYSDRV not in self.boot_parts:
                    self.gpu.refuse("the PSP secure OS was loaded before its system driver (bring-up step 'firmware')")
                else:
                    self.sos_alive = True
                    regs.set(MP.MP0_SMN_C2PMSG_81, SOS_VERSION)
        regs.set(MP.MP0_SMN_C2PMSG_35, READY)

    # --- KM ring ---
    def _ring_control(self, new: int, old: int) -> None:
        regs = self.gpu.regs
        if not self.sos_alive:
            self.gpu.refuse("PSP ring command before the secure OS runs (C2PMSG_81 = 0; bring-up step 'firmware')")
            regs.set(MP.MP0_SMN_C2PMSG_64, READY | 1)  # answered with an error status
            return
        if new == CONST.GFX_CTRL_CMD_ID_DESTROY_RINGS:
            self.ring = None
        elif new == CONST.PSP_RING_TYPE__KM << 16:
            mc = regs.get(MP.MP0_SMN_C2PMSG_69) | regs.get(MP.MP0_SMN_C2PMSG_70) << 32
            self.ring, self.rptr = (mc, regs.get(MP.MP0_SMN_C2PMSG_71)), 0
        regs.set(MP.MP0_SMN_C2PMSG_64, READY)

    def _ring_wptr(self, new: int, old: int) -> None:
        if self.ring is None:
            self.gpu.refuse("PSP ring write pointer moved with no ring created (bring-up step 'firmware')")
            return
        base, size = self.ring
        frame_dwords = _FRAME.size // 4
        while self.rptr != new % (size // 4):
            raw = self._read(base + 4 * self.rptr, _FRAME.size)
            self.rptr = (self.rptr + frame_dwords) % (size // 4)
            if raw is None:
                return
            frame = _FRAME.unpack(raw)
            cmd_mc = frame["cmd_buf_addr_lo"] | frame["cmd_buf_addr_hi"] << 32
            cmd_raw = self._read(cmd_mc, _CMD.size)
            if cmd_raw is None:
                return
            status = self._execute(_CMD.unpack(cmd_raw))
            self._write(cmd_mc + _CMD.offset("resp"), status.to_bytes(4, "little"))
            fence = frame["fence_addr_lo"] | frame["fence_addr_hi"] << 32
            self._write(fence, frame["fence_value"].to_bytes(4, "little"))

    def _execute(self, cmd: dict[str, object]) -> int:
        cmd_id, body = cmd["cmd_id"], cmd["cmd"]
        assert isinstance(body, dict)
        if cmd["buf_size"] != _CMD.size or cmd["buf_version"] != CONST.PSP_GFX_CMD_BUF_VERSION:
            return STATUS_REFUSED
        if cmd_id == CONST.GFX_CMD_ID_SETUP_TMR:
            tmr = body["cmd_setup_tmr"]
            self.tmr = (tmr["buf_phy_addr_lo"] | tmr["buf_phy_addr_hi"] << 32, tmr["buf_size"])
            return 0
        if cmd_id == CONST.GFX_CMD_ID_LOAD_IP_FW:
            load = body["cmd_load_ip_fw"]
            if self.tmr is None:
                self.gpu.refuse("LOAD_IP_FW before SETUP_TMR (bring-up step 'firmware')")
                return STATUS_REFUSED
            data = self._read(load["fw_phy_addr_lo"] | load["fw_phy_addr_hi"] << 32, load["fw_size"])
            if data is None or (load["fw_type"], digest(data)) not in self.accepted:
                self.gpu.violation(f"PSP refused firmware type {load['fw_type']:#x}: not one of the card's images")
                return STATUS_REFUSED
            self.loaded[load["fw_type"]] = digest(data)
            if load["fw_type"] == CONST.GFX_FW_TYPE_SMU:
                self.smu_running = True
            return 0
        if cmd_id == CONST.GFX_CMD_ID_AUTOLOAD_RLC:
            missing = MEC_IMAGES - set(self.loaded)
            if missing:
                self.gpu.refuse(f"RLC autoload without firmware types {sorted(missing)} (bring-up step 'firmware')")
                return STATUS_REFUSED
            self.rlc_autoloaded = True
            return 0
        return CONST.PSP_ERR_UNKNOWN_COMMAND

    # --- SMU mailbox ---
    def _smu_message(self, new: int, old: int) -> None:
        if not self.smu_running:
            return  # no firmware: nobody answers
        answer = CONST.PPSMC_Result_OK if new in (CONST.PPSMC_MSG_TestMessage, CONST.PPSMC_MSG_GetSmuVersion) else 0xFE
        self.gpu.regs.set(MP.MP1_SMN_C2PMSG_90, answer)

    # --- what the engines check ---
    def missing_for(self, engine: str) -> str:
        """'' if `engine` ("sdma" / "mec") has its firmware, else what is missing."""
        if engine == "sdma":
            gone = SDMA_IMAGES - set(self.loaded)
            return f"firmware types {sorted(gone)} not loaded" if gone else ""
        gone = MEC_IMAGES - set(self.loaded)
        if gone:
            return f"firmware types {sorted(gone)} not loaded"
        return "" if self.rlc_autoloaded else "the RLC has not autoloaded"
