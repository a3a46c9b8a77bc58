"""X86Renderer: speck's own x86-64 backend as a codegen Renderer (the `CPU:X86` device's renderer).

Split like the LLVM path, so the expensive part can run in a speck.codegen CompilePool worker process while the
lowering thread goes on with the next kernel: `render(uops)` checks that every value has a register class (the early
refusal below) and writes the linear program as source text (speck.codegen.x86.program_text: one line per UOp);
`X86Compiler.compile(src)` reads it back and runs the backend - legalize -> select -> allocate -> encode - and
returns the ELF object, which also carries the function's Intel-syntax listing (laid out like `objdump -d -M intel`,
with the .rodata constants and relocations in its header): `X86Compiler().disassemble(lib)`. `render_x86(uops)` is
that whole backend on a linear program, with per-stage times (speck.codegen.x86.backend).

Capabilities declared to the pipeline: float32 and bool vectors of up to 16 lanes (one zmm register) on an AVX-512
host, 8 (one ymm register) with AVX2 (bools as lane masks), every other dtype scalar. The instruction set follows the
CPU (speck.codegen.cpu_features: AVX-512 when it has avx512f and X86_AVX512 is not 0; `X86Renderer(avx512=...)`
fixes it); the AVX-512 renderer declares 64-byte vectors and 32 vector registers, and refuses a kernel whose 16-lane
values use a form the zmm selector lacks (ZmmRefusal) before any work: the backend registry then renders that kernel
with the AVX2 renderer (backend X86_AVX2). Every other dtype is scalar; no EXP2/LOG2/SIN instruction (the pipeline's
exact polynomial decompositions are used); vectors of 3/5/6/7 lanes are not preferred (`odd_vector_widths` stays
False) but handled; 4- and 8-lane vectors beside 16-lane ones are (`mixed_vector_widths`: a narrow vector's 16-lane
GEP is widened into a zmm); no half/bfloat16/fp8 registers: a kernel touching those values raises
X86UnsupportedError (an UnsupportedOpError naming op, dtype and kernel) first thing in `render`, so a backend registry
can run that kernel on LLVM instead.
`X86Renderer(fp_contract=True)` fuses a*b+c into FMA instructions.
"""

from __future__ import annotations

from typing import Any, ClassVar

from speck.codegen.cpu_features import host_has_avx512f, x86_avx512_enabled
from speck.codegen.errors import ZmmRefusal
from speck.codegen.kernel_info import kernel_name
from speck.codegen.lower.devectorize import Devectorizer, pm_devectorize
from speck.codegen.renderer import DEFAULT_SUPPORTED_OPS, Renderer
from speck.codegen.renderer.common import check_kernel_name
from speck.codegen.x86.backend import X86Rendering, listing_text, render_x86
from speck.codegen.x86.legalize import check_dtypes
from speck.codegen.x86.program_text import dump_program
from speck.codegen.x86.regs import VEC, ZVEC
from speck.codegen.x86.select import zmm_refusal
from speck.uop import DType, Ops, PatternMatcher, UOp, dtypes

X86_UNSUPPORTED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})
"""No instruction computes these: the pipeline's polynomial decompositions (exact like the interpreter) are used."""


class X86Renderer(Renderer):
    """speck's x86-64 backend (AVX2 + FMA host, AVX-512F where the CPU has it; System V, CPU_ABI.md): float32 and
    bool vectors of up to 16 (AVX-512) or 8 (AVX2) lanes, every other dtype scalar (the pipeline devectorizes it);
    half/bfloat16/fp8 values are refused early (X86UnsupportedError naming op and dtype); EXP2/LOG2/SIN come from the
    pipeline's decompositions."""

    name: ClassVar[str] = "x86"
    device: ClassVar[str] = "CPU"
    supported_ops: ClassVar[frozenset[Ops]] = DEFAULT_SUPPORTED_OPS - X86_UNSUPPORTED
    has_vectors: ClassVar[bool] = True
    supports_float16: ClassVar[bool] = False
    supports_int64: ClassVar[bool] = True
    # 4- and 8-lane float32 vectors beside 16-lane ones in one kernel (select_zmm widens a narrow vector's 16-lane
    # GEP into a zmm): the heuristic may unroll a row reduction by 4 on AVX-512 (speck.codegen.opt.heuristic)
    mixed_vector_widths: ClassVar[bool] = True
    # the host's instruction set as data (lowered-program cache keys hold a renderer's data attributes: a cache
    # shared between an AVX-512 and an AVX2 host must not mix their programs)
    host_isa: ClassVar[str] = "avx512f" if host_has_avx512f() else "avx2"

    # decompositions (exp2/log2/sin polynomials) run after devectorization and may build bool/int vectors again:
    # split those once more at the very end (the rewrite context is the renderer itself, see `width`)
    extra_matcher: ClassVar[PatternMatcher | None] = pm_devectorize

    def __init__(self, fp_contract: bool = False, avx512: bool | None = None) -> None:
        """`fp_contract`: fuse a*b+c into one FMA instruction, rounded once (as LLVMRenderer(fp_contract=True)); results
        may differ from the exact default in the last bit; about twice the multiply-add throughput.
        `avx512`: select AVX-512 (zmm, opmasks) or AVX2; None follows the host and the X86_AVX512 setting at each
        use (speck.codegen.cpu_features.x86_avx512_enabled). True on a host without avx512f builds objects that
        host cannot run (for listings and emulation)."""
        self.fp_contract = fp_contract
        self.avx512 = avx512

    @property
    def uses_avx512(self) -> bool:
        """Whether this renderer shapes programs for AVX-512 (16-lane float32 vectors in zmm registers)."""
        return x86_avx512_enabled() if self.avx512 is None else self.avx512

    @property
    def max_vector_bytes(self) -> int:  # type: ignore[override]
        """64 (zmm) with AVX-512, else 32 (ymm)."""
        return 64 if self.uses_avx512 else 32

    @property
    def vector_registers(self) -> int:  # type: ignore[override]
        """The vector registers the allocator hands out for float vectors: zmm16..29 with AVX-512 (14), ymm0..12
        with AVX2 (13); the rest are the selector's scratch registers."""
        return len((ZVEC if self.uses_avx512 else VEC).allocatable)

    def extra_context(self) -> Any:
        """The renderer_extra stage devectorizes again (after decompositions made new wide values), by this
        renderer's widths."""
        return Devectorizer(self)

    def max_vec_lanes(self, dtype: DType) -> int:
        """float32 and bool get 16 lanes with AVX-512 (one zmm register), else 8 (one ymm register; bools as 32-bit
        lane masks, lane for lane with the floats they compare and select); every other dtype is devectorized to
        scalars."""
        return self.max_vector_bytes // 4 if dtype.scalar() in (dtypes.float32, dtypes.bool) else 1

    def render(self, uops: list[UOp]) -> str:
        """The kernel's source text (speck.codegen.x86.program_text), after the early refusal of values without a
        register class; `X86Compiler().compile(src)` runs the backend on it."""
        name = check_kernel_name(kernel_name(uops[-1]), "x86") if uops else "kernel"  # ("a b" broke the header)
        check_dtypes(uops, name)
        if self.max_vector_bytes > 32 and (why := zmm_refusal(uops)) is not None:
            u, reason = why
            raise ZmmRefusal(f"x86 backend: the AVX-512 selector does not take {u.op.name} on {u.dtype} in kernel "
                             f"{name!r} ({reason}); rendering it for AVX2", u.op, u.dtype)  # fmt: skip
        return dump_program(uops, self.fp_contract)


__all__ = ["X86Renderer", "X86Rendering", "X86_UNSUPPORTED", "ZmmRefusal", "listing_text", "render_x86"]
