"""Drive the simulated GPU without USB: the driver's own bring-up (speck.usbgpu.amd.bringup) applied to the model's
BAR5 and VRAM directly, so model unit tests start from the state the driver leaves the card in."""

from __future__ import annotations

import struct

from speck.usbgpu.amd import bringup, ucode
from speck.usbgpu.amd.layout import RING_VA
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.sdma import DOORBELL_INDEX
from speck.usbgpu.api import KernelCode, UsbGpu
from speck.usbgpu.sim.device import SimDevice


class DirectBus:
    """Single-dword register access straight into the model's BAR5 (what a TLP through the bridge does)."""

    def __init__(self, dev: SimDevice) -> None:
        self.dev = dev

    def mem_read32(self, address: int) -> int:
        return self.dev.gpu.mmio_read(address)

    def mem_write32(self, address: int, value: int) -> None:
        self.dev.gpu.mmio_write(address, value)


def ring_doorbell(dev: SimDevice, index: int, value: int) -> None:
    dev.gpu.doorbell_write(4 * index, value & 0xFFFFFFFF)
    dev.gpu.doorbell_write(4 * index + 4, value >> 32)


def bring_up(dev: SimDevice) -> tuple[Mmio, bringup.Card]:
    """Bus mastering on, then the driver's bring-up steps (NBIO, GMC and page tables, IH, firmware through the PSP,
    SDMA0 queue 0, MEC, compute queue)."""
    dev.fabric.gpu.set_dword(0x04, 0x7)
    mmio = Mmio(DirectBus(dev), 0, 1 << 20, dev.gpu.regs.bases)
    io = bringup.VramIo(dev.gpu.bar0_write, dev.gpu.vram.read)
    firmware = ucode.load(dev.firmware_files())
    card = bringup.bring_up(mmio, io, lambda i, v: ring_doorbell(dev, i, v), firmware, dev.gpu.vram.size, [])
    return mmio, card


def submit(dev: SimDevice, packets: list[int], run_ms: int = 10) -> None:
    """Put `packets` at the start of SDMA0's ring and ring its doorbell (wptr shadow first, as the driver does)."""
    data = struct.pack(f"<{len(packets)}I", *packets)
    dev.gpu.bar0_write(RING_VA, data)
    wptr = struct.pack("<Q", len(data))
    dev.gpu.bar0_write(RING_VA + (1 << 20) + 8, wptr)
    ring_doorbell(dev, 2 * DOORBELL_INDEX, len(data))
    dev.wait(None, run_ms)


# a gfx1100 kernel that spins until *flag == 12345 (nobody writes it): a dispatch that never ends
SPIN = """
define amdgpu_kernel void @spin(ptr addrspace(1) %flag) {
entry:
  br label %loop
loop:
  %v = load volatile i32, ptr addrspace(1) %flag
  %z = icmp eq i32 %v, 12345
  br i1 %z, label %done, label %loop
done:
  ret void
}
"""

# reads in[tid + off] (a 64-bit element offset): an offset past the allocation is a page fault
OOB = """
declare i32 @llvm.amdgcn.workitem.id.x()
define amdgpu_kernel void @oob(ptr addrspace(1) %out, ptr addrspace(1) %in, i64 %off) {
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %t = zext i32 %tid to i64
  %i = add i64 %t, %off
  %pi = getelementptr float, ptr addrspace(1) %in, i64 %i
  %v = load float, ptr addrspace(1) %pi
  %po = getelementptr float, ptr addrspace(1) %out, i32 %tid
  store float %v, ptr addrspace(1) %po
  ret void
}
"""


def load_kernel(gpu: UsbGpu, code_object: bytes, name: str) -> KernelCode:
    """Upload a code object's image and describe kernel `name` from its kernel descriptor, as a loader does (the
    emulator's code-object reader stands in for the runtime's)."""
    from speck.usbgpu.sim.rdna3.codeobject import parse_code_object

    co = parse_code_object(code_object)
    entry, kd = co.kernel(name)
    image = gpu.upload(co.image)
    return KernelCode(
        entry=image.va + entry,
        rsrc1=kd.rsrc1,
        rsrc2=kd.rsrc2,
        rsrc3=kd.rsrc3,
        user_sgprs=[s for s, on in kd.user_sgpr_flags.items() if on],
        group_segment_size=kd.group_segment_fixed_size,
        private_segment_size=kd.private_segment_fixed_size,
        kernarg_size=kd.kernarg_size,
        name=name,
        dynamic_stack=kd.uses_dynamic_stack,
    )
