"""The Renderer base class: what a backend declares about itself so the lowering pipeline can shape programs for it.

A renderer turns a program (the linear UOp list of KERNEL_CONTRACT.md section 2) into text (C, LLVM IR, Python,
an x86 listing). Before that, `full_rewrite_to_sink` reads the declarations below to decide how far to lower:
which ALU ops must be decomposed, how wide vectors may be, which float formats need emulation. Concrete renderers
(ClangRenderer, LLVMRenderer, PythonRenderer, the x86 backend) subclass `Renderer`, override the class attributes
that differ and implement `render`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from speck.codegen.errors import UnsupportedOpError
from speck.uop import DType, GroupOp, Ops, PatternMatcher, UOp, dtypes, exec_alu
from speck.uop.alu import python_alu
from speck.uop.helpers import Target

# ALU ops every backend is expected to express directly; the pipeline decomposes the others (THREEFRY into 32-bit
# integer ops, POW into exp2/log2, MULACC into MUL+ADD) unless a renderer adds them to `supported_ops`.
DEFAULT_SUPPORTED_OPS: frozenset[Ops] = GroupOp.ALU - {Ops.THREEFRY, Ops.POW, Ops.MULACC}


class Renderer:
    """Base class of every backend. Class attributes are the declarations the pipeline reads; subclasses override.

    Attributes (all class-level, so a renderer class can be inspected without instantiating it):
      name: short identifier reported in ProgramSpec.renderer and in error messages ("c", "llvm", "python", "x86").
      device: the device family the output runs on ("CPU" for every host renderer).
      supported_ops: ALU ops the renderer expresses directly; anything else in GroupOp.ALU is decomposed by the
        pipeline (exp2/log2/sin by polynomials, POW via exp2/log2, THREEFRY in 32-bit ops, MULACC as MUL+ADD).
      has_vectors: whether vector dtypes (STACK/GEP, vector LOAD/STORE/ALU) may reach `render`; False makes the
        pipeline devectorize everything to scalars.
      max_vector_bytes: widest vector register in bytes (32 = 256-bit AVX2; 64 on AVX-512 hosts). Wider vectors
        are split by devectorization.
      vector_registers: how many vector registers the target has (16 with AVX2, 32 with AVX-512), for the optimizer
        (matmul blocks, 4 rows x 2 vectors, are sized for 16; dot-product blocks of x @ W.T grow to 4 x 4 with 32
        where `wide_shuffles`).
      supports_float16: arithmetic directly in float16; False -> half ALU ops are computed in float32 and rounded.
      supports_bfloat16: bfloat16 arithmetic natively; False -> bfloat16 ALU ops are computed in float32 and cast
        back (LOAD/STORE and CASTs of bfloat16 still reach the renderer, which converts the storage bits).
      supports_fp8: likewise for fp8e4m3/fp8e5m2.
      supports_int64: 64-bit integer arithmetic is available (index lowering may use int64 when bounds need it).
      index_int64: index math (ranges, index arithmetic) is int64 even where int32 holds every value (needs
        supports_int64). The LLVM CPU renderer sets it: on x86-64 addresses are 64-bit, and int32 index math reaches
        LLVM sign-extended at every address, which its loop analyses (scalar evolution, IV users, loop strength
        reduction) spend much of a kernel's compile on (the kernels of a CNN training step compile in ~55% of the
        time with it, and run as fast).
      mixed_vector_widths: power-of-two vectors narrower than a register may stand beside full-width ones in one
        kernel (4 lanes next to AVX-512's 16) and render correctly; the optimizer then may unroll a row reduction by
        4 on a 16-lane target. Renderers with odd_vector_widths take any mix anyway.
      has_local: workgroup-local memory and LOCAL ranges exist (False on CPUs: the optimizer won't emit LOCAL).
      has_threads: the CPU ABI core slicing applies: the outermost GLOBAL range is split across worker threads.
      global_max: upper bound for each global dimension the runtime can launch (None: unbounded).
      suffix, has_shared, local_max, global_prod_max, shared_max, tensor_cores: tinygrad's Renderer fields (read
        by its users, not by speck's pipeline), declared at what CPU renderers have.
      max_workgroup_size: work-items one workgroup may have in all (None: no workgroups, on CPUs); LOCAL/GROUP opts
        that would exceed it are refused.
      wave_size: work-items that execute in lockstep as one hardware thread (32 on RDNA3 in wave32 mode; 1 on CPUs).
      vgpr_budget: 32-bit registers per work-item the GPU heuristic keeps upcast values within (0 on CPUs, whose
        budget is `vector_registers`).
      extra_matcher: renderer-specific rewrites run as the last pipeline stage before linearization (e.g. turning
        a pattern into a machine idiom); None for none.
    Derived (properties a subclass may override):
      target: tinygrad's name for the DEV target (device, renderer, arch) the renderer serves.
      code_for_op: tinygrad's name for the ops a backend renders natively, as a read-only dict keyed by the Ops of
        `supported_ops` (users test `Ops.SQRT in renderer.code_for_op`); each value is the op's Python semantics.
      register_blocking: whether the optimizer register-blocks matmul-like reductions (blocks of outputs kept in
        vector registers across the reduction): CPU renderers with vectors.
      odd_vector_widths: vectors of any lane count (3, 5, 6...) render as efficiently as power-of-two ones; False
        makes the optimizer avoid choosing them where it has a power-of-two alternative (it may still produce
        them, e.g. a register block of 5 rows).
      wide_shuffles: a GEP gathering lanes from two vector registers costs about one instruction per register
        (LLVM's shufflevector); the expander then combines an unrolled reduction's lanes as a tree of halves.
        False (lane-by-lane gathers, as x86's selector does) keeps one lane group at a time, which moves half
        as many lanes.
    """

    name: ClassVar[str] = "base"
    device: ClassVar[str] = "CPU"
    supported_ops: ClassVar[frozenset[Ops]] = DEFAULT_SUPPORTED_OPS
    has_vectors: ClassVar[bool] = False
    max_vector_bytes: ClassVar[int] = 32
    vector_registers: ClassVar[int] = 16
    # vectors live in a CPU's registers (register blocking pays); the Python reference renderer's do not
    registers_are_cpu: ClassVar[bool] = True
    supports_float16: ClassVar[bool] = False
    supports_bfloat16: ClassVar[bool] = False
    supports_fp8: ClassVar[bool] = False
    supports_int64: ClassVar[bool] = True
    index_int64: ClassVar[bool] = False
    mixed_vector_widths: ClassVar[bool] = False
    has_local: ClassVar[bool] = False
    has_threads: ClassVar[bool] = True
    global_max: ClassVar[tuple[int, ...] | None] = None
    # tinygrad's Renderer fields its users read, at what a CPU renderer has: no workgroup-shared memory, no
    # workgroup size limit, no tensor cores (supports_float4 follows has_vectors)
    suffix: ClassVar[str] = ""
    has_shared: ClassVar[bool] = False
    local_max: ClassVar[tuple[int, ...] | None] = None
    global_prod_max: ClassVar[tuple[int, ...] | None] = None
    shared_max: ClassVar[int] = 0
    tensor_cores: ClassVar[tuple[Any, ...]] = ()
    max_workgroup_size: ClassVar[int | None] = None
    wave_size: ClassVar[int] = 1
    vgpr_budget: ClassVar[int] = 0
    extra_matcher: ClassVar[PatternMatcher | None] = None

    def supported_dtypes(self) -> set[DType]:
        """Every scalar dtype programs for this renderer can compute with. Float formats without native arithmetic
        (supports_float16/bfloat16/fp8 False) count: the pipeline computes them in float32 and rounds back; int64
        needs supports_int64."""
        from speck.uop.dtype import CONCRETE_SCALARS

        return {d for d in CONCRETE_SCALARS if self.supports_int64 or d not in (dtypes.int64, dtypes.uint64)}

    @property
    def code_for_op(self) -> Mapping[Ops, Callable[..., Any]]:
        return _code_for_op(self.supported_ops)

    @property
    def target(self) -> Target:
        """tinygrad's name: the DEV target this renderer serves (device, renderer name upper-cased, its arch where
        it has one, e.g. `AMD:AMDGPU:gfx1100`)."""
        return Target(device=self.device, renderer=self.name.upper(), arch=str(getattr(self, "arch", "")))

    @property
    def supports_float4(self) -> bool:
        """tinygrad's name: whether programs may use 4-wide float vectors."""
        return self.has_vectors

    @property
    def register_blocking(self) -> bool:
        """Register blocking pays where vectors are a CPU's registers; the Python reference renderer (device PYTHON)
        and scalar renderers keep the plain heuristic."""
        return self.has_vectors and self.registers_are_cpu

    @property
    def pow2_vectors(self) -> bool:
        """Vector types exist only for power-of-two lane counts (C's vector_size): devectorization splits a 5-lane
        value into 4 + 1 lanes for such renderers."""
        return False

    @property
    def wide_shuffles(self) -> bool:
        """False unless the renderer says otherwise (see the class docstring)."""
        return False

    @property
    def odd_vector_widths(self) -> bool:
        """False unless the renderer says otherwise (C vector types need a power of two lanes, x86 puts odd widths
        together from pieces); LLVM's vectors take any lane count."""
        return False

    def extra_context(self) -> object:
        """The ctx the renderer_extra stage's `extra_matcher` rules receive (the renderer itself by default)."""
        return self

    def max_vec_lanes(self, dtype: DType) -> int:
        """How many lanes of scalar `dtype` fit one vector register (1 when the renderer has no vectors)."""
        if not self.has_vectors:
            return 1
        return max(1, self.max_vector_bytes // max(1, dtype.scalar().itemsize))

    def supports(self, op: Ops, dtype: DType) -> bool:
        """Whether `op` producing/operating on `dtype` can be rendered directly. The default checks `supported_ops`
        and the float-format flags; subclasses refine it for per-dtype gaps (e.g. no vector int64 division)."""
        if op in GroupOp.ALU and op not in self.supported_ops:
            return False
        s = dtype.scalar()
        if op in GroupOp.ALU and op not in GroupOp.Comparison:  # comparisons of narrow floats are rendered as is
            if s == dtypes.float16 and not self.supports_float16:
                return False
            if s == dtypes.bfloat16 and not self.supports_bfloat16:
                return False
            if dtypes.is_fp8(s) and not self.supports_fp8:
                return False
        return not (s in (dtypes.int64, dtypes.uint64) and not self.supports_int64)

    def check_supported(self, op: Ops, dtype: DType) -> None:
        """Raise UnsupportedOpError (naming op, dtype and renderer) unless `supports(op, dtype)`."""
        if not self.supports(op, dtype):
            raise UnsupportedOpError(self.name, op, dtype)

    def render(self, uops: list[UOp]) -> str:
        """Render a linearized program (KERNEL_CONTRACT.md section 2; the last UOp is the SINK whose arg is the
        KernelInfo carrying the function name) to source text. Subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__}.render is not implemented")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


@functools.cache
def _code_for_op(ops: frozenset[Ops]) -> Mapping[Ops, Callable[..., Any]]:
    return MappingProxyType({op: python_alu.get(op) or functools.partial(exec_alu, op) for op in sorted(ops)})


__all__ = ["DEFAULT_SUPPORTED_OPS", "Renderer", "UnsupportedOpError"]
