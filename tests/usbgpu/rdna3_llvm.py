"""Test kernels for the RDNA3 emulator, built with independent tools: LLVM IR compiled by llvmlite for
amdgcn-amd-amdhsa gfx1100, or assembly by llvm-mc-16, linked into HSA code objects by ld.lld-16 (llvm-16 and lld-16
are Debian packages the test command installs; the llvm-objdump-16 cross-check is tests/codegen/codegen_rdna3.py's,
shared with codegen's tests)."""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile
from pathlib import Path

from codegen_rdna3 import tool

CPU = "gfx1100"
TRIPLE = "amdgcn-amd-amdhsa"
COV5 = '!llvm.module.flags = !{!900}\n!900 = !{i32 1, !"amdhsa_code_object_version", i32 500}\n'


def _link(obj: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.o").write_bytes(obj)
        subprocess.run([tool("ld.lld-16"), "-shared", "k.o", "-o", "k.so"], cwd=d, check=True, capture_output=True)
        return (Path(d) / "k.so").read_bytes()


@functools.cache
def compile_ir(ir: str, true16: bool = False) -> bytes:
    """An HSA code object (shared object) from LLVM IR; true16 picks LLVM's 16-bit register halves (its default
    for gfx11) over whole registers for 16-bit values."""
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    src = f'target triple = "{TRIPLE}"\n{ir}\n{COV5}'
    mod = llvm.parse_assembly(src)
    mod.verify()
    target = llvm.Target.from_triple(TRIPLE)
    tm = target.create_target_machine(cpu=CPU, features="" if true16 else "-real-true16", opt=3, reloc="pic")
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return _link(tm.emit_object(mod))


@functools.cache
def assemble(asm: str) -> bytes:
    """An HSA code object from gfx1100 assembly (with .amdhsa_kernel directives)."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "k.s").write_text(asm)
        cmd = [tool("llvm-mc-16"), f"-triple={TRIPLE}", f"-mcpu={CPU}", "-filetype=obj", "k.s", "-o", "k.o"]
        subprocess.run(cmd, cwd=d, check=True, capture_output=True)
        return _link((Path(d) / "k.o").read_bytes())


def encode(line: str) -> list[int]:
    """The dwords llvm-mc-16 assembles one instruction into."""
    out = subprocess.run(
        [tool("llvm-mc-16"), f"-triple={TRIPLE}", f"-mcpu={CPU}", "-show-encoding"],
        input=line,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"encoding: \[([^\]]*)\]", out)
    assert m is not None, out
    raw = bytes(int(x, 16) for x in m.group(1).split(","))
    return [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]


def kernel(name: str, args: str, body: str, decls: str = "") -> str:
    """An amdgpu_kernel definition with the usual id intrinsics declared."""
    ids = "\n".join(
        f"declare i32 @llvm.amdgcn.{k}.id.{a}()" for k in ("workitem", "workgroup") for a in ("x", "y", "z")
    )
    head = f"{ids}\ndeclare void @llvm.amdgcn.s.barrier()\n{decls}\n"
    return f"{head}define amdgpu_kernel void @{name}({args}) {{\n{body}\n}}\n"


def asm_kernel(body: str, name: str = "k", vgprs: int = 8, extra: str = "") -> str:
    """A gfx1100 kernel in assembly: `body` runs with the kernarg pointer in s[0:1] (the only user SGPRs) and the
    workgroup id x in s2."""
    return f"""
.text
.globl {name}
.p2align 8
.type {name},@function
{name}:
{body}
  s_endpgm
.rodata
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_next_free_vgpr {vgprs}
  .amdhsa_next_free_sgpr 16
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_user_sgpr_count 2
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_wavefront_size32 1
{extra}
.end_amdhsa_kernel
"""
