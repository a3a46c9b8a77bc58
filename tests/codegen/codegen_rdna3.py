"""Running the AMD backend's programs on the RDNA3 emulator (speck.usbgpu.sim.rdna3, a test tool like the x86
emulator: codegen itself never imports usbgpu). A ProgramSpec's code object is launched over its grid with its
buffers mapped into an emulated address space (unmapped gaps between them, so an overrun faults) and its kernel
arguments laid out as the renderer declares them: the pointers of the buffers the kernel uses (by slot), then the
variables as int32."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from speck.usbgpu.sim.rdna3 import FlatMemory, Stats, run


def kernargs(pointers: list[int], var_values: list[int]) -> bytes:
    """The kernarg segment of `define amdgpu_kernel void @k(ptr addrspace(1) %data0, ..., i32 %var, ...)`: every
    argument at its natural alignment, pointers first."""
    return b"".join(struct.pack("<Q", p) for p in pointers) + b"".join(struct.pack("<i", v) for v in var_values)


def run_emulated(
    spec: Any, inputs: list[np.ndarray], var_vals: dict[str, int], max_instructions: int | None = 50_000_000
) -> tuple[list[np.ndarray], Stats]:
    """Every buffer after `spec` ran in the emulator (inputs[i] is the buffer of PARAM slot i), and the run's Stats."""
    assert spec.lib is not None, f"{spec.name} is not compiled"
    mem = FlatMemory()
    ptrs = [mem.alloc(np.ascontiguousarray(b).view(np.uint8) if b.nbytes else 4, f"data{i}") for i, b in
            enumerate(inputs)]  # fmt: skip
    args = kernargs([ptrs[b.slot] for b in spec.buffers], [var_vals[n] for n in spec.var_names])  # the kernel's own
    block = spec.local_size or (1, 1, 1)  # a program without work-item ids is one work-item
    stats = run(spec.lib, spec.function_name, spec.launch_dims(var_vals), block, args, mem,
                max_instructions=max_instructions)  # fmt: skip
    outs = [mem.array(p, b.dtype, b.size).copy() for p, b in zip(ptrs, inputs)]
    return outs, stats
