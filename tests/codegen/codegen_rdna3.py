"""Running the AMD backend's programs on the RDNA3 emulator (speck.usbgpu.sim.rdna3, a test tool like the x86
emulator: codegen itself never imports usbgpu). A ProgramSpec's code object is launched over its grid with its
buffers mapped into an emulated address space (unmapped gaps between them, so an overrun faults) and its kernel
arguments laid out as the renderer declares them: the pointers of the buffers the kernel uses (by slot), then the
variables as int32. The decoder's cross-check: `objdump_mismatches` compares its disassembly with llvm-objdump-16's,
instruction by instruction (tests/usbgpu's emulator tests share it)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from speck.usbgpu.sim.rdna3 import FlatMemory, Stats, disassemble, run
from speck.usbgpu.sim.rdna3.codeobject import parse_code_object


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


def tool(name: str) -> str:
    """An LLVM 16 tool (Debian's llvm-16 and lld-16 packages, which the README's test command installs)."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: the RDNA3 emulator tests need Debian's llvm-16 and lld-16")
    return path


_LINE = re.compile(r"^\s+(\S.*?)\s*// ([0-9A-F]{12}): ((?:[0-9A-F]{8} ?)+)")
_COMMENT = re.compile(r"\s*(;.*|/\*.*?\*/)")


def objdump(so: bytes) -> list[tuple[int, str]]:
    """(address, instruction text) for every instruction llvm-objdump-16 prints in .text."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.so").write_bytes(so)
        out = subprocess.run(
            [tool("llvm-objdump-16"), "--mcpu=gfx1100", "-d", "k.so"], cwd=d, check=True, capture_output=True, text=True
        ).stdout
    return [(int(m.group(2), 16), m.group(1)) for m in map(_LINE.match, out.splitlines()) if m]


def normalize(text: str) -> str:
    """One spelling per instruction: comments LLVM 16 appends to registers it cannot name are dropped."""
    return " ".join(_COMMENT.sub("", text).replace(",", ", ").split()).replace(" ,", ",")


def objdump_mismatches(so: bytes) -> list[str]:
    """Where the emulator's decoder and llvm-objdump-16 disagree on a code object's instructions (mnemonic and
    operands, instruction by instruction); empty when they agree everywhere."""
    image = parse_code_object(so).image
    want = objdump(so)
    if not want:
        return ["llvm-objdump-16 printed no instructions"]
    first, last = want[0][0], want[-1][0]
    mine = {i.pc: i for i in disassemble(image[first : last + 16], first)}
    problems = []
    for addr, text in want:
        inst = mine.get(addr)
        if inst is None:
            problems.append(f"{addr:#x}: objdump has {text!r}, the decoder has no instruction starting here")
        elif text.startswith(".long"):  # LLVM 16 predates some gfx11 (true16) encodings LLVM 22 emits
            if inst.name.startswith("<"):
                problems.append(f"{addr:#x}: {text!r} is unknown to both")
        elif normalize(text) != normalize(inst.text):
            problems.append(f"{addr:#x}: objdump {normalize(text)!r} decoder {normalize(inst.text)!r}")
    return problems
