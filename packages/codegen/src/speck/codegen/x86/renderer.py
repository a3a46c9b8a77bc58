"""X86Renderer: speck's own x86-64 backend as a codegen Renderer (the `CPU:X86` device's renderer).

`render(uops)` runs the whole backend - legalize -> select -> allocate -> encode - and returns the kernel as an
assembly listing (Intel syntax, laid out like `objdump -d -M intel`) that also carries everything needed to rebuild
the object: the encoded bytes of every instruction, the .rodata constants and the relocations (`# .rodata` and
`# .reloc` header lines). `X86Compiler.compile` turns that text back into the ELF object without re-running any
stage, so ProgramSpec.src is a readable listing and ProgramSpec.lib the object, as for the other CPU renderers.

Capabilities declared to the pipeline: float32 and bool vectors of up to 8 lanes (one ymm register; bools as lane
masks; AVX2, no AVX-512), every other dtype scalar; no EXP2/LOG2/SIN instruction (the pipeline's exact polynomial
decompositions are used); vectors of 3/5/6/7 lanes are not preferred (`odd_vector_widths` stays False) but handled;
no half/bfloat16/fp8 registers: a kernel touching those values raises X86UnsupportedError (an UnsupportedOpError
naming op, dtype and kernel) first thing in `render`, before any instruction is selected, so a backend registry can
run that kernel on LLVM instead. `X86Renderer(fp_contract=True)` fuses a*b+c into FMA instructions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from speck.codegen.kernel_info import kernel_name
from speck.codegen.lower.devectorize import Devectorizer, pm_devectorize
from speck.codegen.renderer import DEFAULT_SUPPORTED_OPS, Renderer
from speck.codegen.x86.alloc import allocate_function
from speck.codegen.x86.assembler import Assembled, assemble
from speck.codegen.x86.compiler import remember_object
from speck.codegen.x86.elf_object import write_elf_object
from speck.codegen.x86.legalize import legalize
from speck.codegen.x86.select import select
from speck.uop import DType, Ops, PatternMatcher, UOp, dtypes

X86_UNSUPPORTED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})
"""No instruction computes these: the pipeline's polynomial decompositions (exact like the interpreter) are used."""


@dataclass
class X86Rendering:
    """Everything one kernel's trip through the backend produced, with per-stage times in seconds."""

    name: str
    obj: bytes
    asm: Assembled
    rodata: bytes
    times: dict[str, float] = field(default_factory=dict)

    @property
    def listing(self) -> str:
        """The Intel-syntax listing (objdump layout) of the function, preceded by the object's rodata/relocations."""
        head = [f"# speck x86-64 kernel {self.name}: {len(self.asm.code)} bytes of code"]
        if self.rodata:
            head.append(f"# .rodata {self.rodata.hex()}")
        for r in self.asm.relocations:
            head.append(f"# .reloc {r.offset:#x} {r.kind} {r.symbol} {r.addend}")
        return "\n".join(head) + f"\n{0:016x} <{self.name}>:\n" + self.asm.listing


def render_x86(uops: list[UOp], fp_contract: bool = False) -> X86Rendering:
    """Run the backend on a linear program (KERNEL_CONTRACT.md section 2): legalize, select, allocate registers,
    encode, write the ELF object. Raises X86UnsupportedError (an UnsupportedOpError) naming op, dtype and kernel for
    anything it cannot select.
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
    obj = write_elf_object(name, asm.code, asm.relocations, rodata)
    t4 = time.perf_counter()
    times = {"legalize": t1 - t0, "select": t2 - t1, "allocate": t3 - t2, "encode": t4 - t3}
    return X86Rendering(name, obj, asm, rodata, times)


class X86Renderer(Renderer):
    """speck's x86-64 backend (AVX2 + FMA host, System V, CPU_ABI.md): float32 and bool vectors of up to 8 lanes,
    every other dtype scalar (the pipeline devectorizes it); half/bfloat16/fp8 values are refused early
    (X86UnsupportedError naming op and dtype); EXP2/LOG2/SIN come from the pipeline's decompositions."""

    name: ClassVar[str] = "x86"
    device: ClassVar[str] = "CPU"
    supported_ops: ClassVar[frozenset[Ops]] = DEFAULT_SUPPORTED_OPS - X86_UNSUPPORTED
    has_vectors: ClassVar[bool] = True
    max_vector_bytes: ClassVar[int] = 32
    supports_float16: ClassVar[bool] = False
    supports_int64: ClassVar[bool] = True

    # decompositions (exp2/log2/sin polynomials) run after devectorization and may build bool/int vectors again:
    # split those once more at the very end (the rewrite context is the renderer itself, see `width`)
    extra_matcher: ClassVar[PatternMatcher | None] = pm_devectorize

    def __init__(self, fp_contract: bool = False) -> None:
        """`fp_contract`: fuse a*b+c into one FMA instruction, rounded once (as LLVMRenderer(fp_contract=True)); results
        may differ from the exact default in the last bit; about twice the multiply-add throughput."""
        self.fp_contract = fp_contract

    def extra_context(self) -> Any:
        """The renderer_extra stage devectorizes again (after decompositions made new wide values), by this
        renderer's widths."""
        return Devectorizer(self)

    def max_vec_lanes(self, dtype: DType) -> int:
        """float32 and bool get 8 lanes (one ymm register; bools as 32-bit lane masks, lane for lane with the floats
        they compare and select); every other dtype is devectorized to scalars."""
        return self.max_vector_bytes // 4 if dtype.scalar() in (dtypes.float32, dtypes.bool) else 1

    def render(self, uops: list[UOp]) -> str:
        """The kernel's listing (see the module docstring); `X86Compiler().compile(listing)` gives the object."""
        r = render_x86(uops, self.fp_contract)
        text = r.listing
        remember_object(text, r.obj)  # compile(text) hands this object back instead of parsing the text
        return text


__all__ = ["X86Renderer", "X86Rendering", "X86_UNSUPPORTED", "render_x86"]
