"""The x86 backend proper: a linear program (KERNEL_CONTRACT.md section 2) -> legalize -> select -> allocate ->
encode -> ELF object carrying its listing. X86Compiler runs it on the program X86Renderer wrote as text; this module
imports only the backend's own stages (not the Renderer side), so a CompilePool worker starts quickly."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from speck.codegen.kernel_info import kernel_name
from speck.codegen.x86.alloc import allocate_function
from speck.codegen.x86.assembler import Assembled, assemble
from speck.codegen.x86.elf_object import write_elf_object
from speck.codegen.x86.legalize import legalize
from speck.codegen.x86.select import select
from speck.uop import UOp


@dataclass
class X86Rendering:
    """Everything one kernel's trip through the backend produced, with per-stage times in seconds. `obj` carries
    `listing` (its .speck.listing section)."""

    name: str
    obj: bytes
    asm: Assembled
    rodata: bytes
    listing: str
    times: dict[str, float] = field(default_factory=dict)


def listing_text(name: str, asm: Assembled, rodata: bytes) -> str:
    """The Intel-syntax listing (objdump layout) of the function, preceded by the object's rodata/relocations."""
    head = [f"# speck x86-64 kernel {name}: {len(asm.code)} bytes of code"]
    if rodata:
        head.append(f"# .rodata {rodata.hex()}")
    for r in asm.relocations:
        head.append(f"# .reloc {r.offset:#x} {r.kind} {r.symbol} {r.addend}")
    return "\n".join(head) + f"\n{0:016x} <{name}>:\n" + asm.listing


def render_x86(uops: list[UOp], fp_contract: bool = False) -> X86Rendering:
    """Run the backend on a linear program (KERNEL_CONTRACT.md section 2): legalize, select, allocate registers,
    encode, write the ELF object (with its listing). Raises X86UnsupportedError (an UnsupportedOpError) naming op,
    dtype and kernel for anything it cannot select.
    `fp_contract`: fuse a*b+c into one FMA (rounded once)."""
    name = kernel_name(uops[-1]) if uops else "kernel"
    t0 = time.perf_counter()
    legal = legalize(uops, name)
    t1 = time.perf_counter()
    items, rodata = select(legal, name, fp_contract)
    t2 = time.perf_counter()
    fn = allocate_function(items)
    t3 = time.perf_counter()
    asm = assemble(fn.items)
    t4 = time.perf_counter()
    listing = listing_text(name, asm, rodata)
    obj = write_elf_object(name, asm.code, asm.relocations, rodata, listing)
    t5 = time.perf_counter()
    times = {"legalize": t1 - t0, "select": t2 - t1, "allocate": t3 - t2, "encode": t4 - t3, "elf": t5 - t4}
    return X86Rendering(name, obj, asm, rodata, listing, times)


__all__ = ["X86Rendering", "listing_text", "render_x86"]
