"""A stand-in code-object loader for simulator sessions, tests and benchmarks: uploads an HSA code object's image
and describes one kernel from its 64-byte kernel descriptor (read by the emulator's code-object reader,
speck.usbgpu.sim.rdna3.codeobject; needs speck-usbgpu[sim]). A runtime brings its own loader (speck.hcq.hsaco)."""

from __future__ import annotations

from speck.usbgpu.amd.compute import KernelCode
from speck.usbgpu.api import UsbGpu


def load_kernel(gpu: UsbGpu, code_object: bytes, name: str) -> KernelCode:
    """Upload `code_object`'s loaded image to `gpu` and return kernel `name`'s KernelCode (entry in VRAM)."""
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
