"""Decompositions: rewrite ALU ops a renderer does not declare (Renderer.supports) in terms of ops it has.

MULACC(a, b, c)   -> a*b + c
POW(x, y)         -> exp2(y * log2(x)) with sign/zero/integer-exponent fixups (floats only)
THREEFRY(x, key)  -> Threefry-2x32 (20 rounds) in uint32 ADD/XOR/SHL/SHR/OR, recombined into uint64
EXP2, LOG2, SIN   -> polynomial approximations (speck.codegen.lower.transcendental), accuracy documented there
float16 / bfloat16 / fp8 arithmetic on a renderer without it -> computed in float32 and cast back
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.lower import transcendental as tr
from speck.codegen.settings import TRANSCENDENTAL
from speck.uop import DType, GroupOp, Ops, PatternMatcher, UOp, UPat, dtypes
from speck.uop.alu import threefry_rounds
from speck.uop.symbolic import fold_alu, fold_cast

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


# >=2: exp2/log2/sin always use the polynomial decompositions, even where the renderer has them (to test them);
# 0 and 1 behave alike: software only where the renderer lacks the op
_SOFTWARE_WHEN_FORCED = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})


class Decomposer:
    """Holds the renderer whose capabilities decide which rules fire."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.force_software = TRANSCENDENTAL >= 2

    def lacks(self, op: Ops, dt: DType) -> bool:
        return not self.renderer.supports(op, dt) or (self.force_software and op in _SOFTWARE_WHEN_FORCED)


def _promote_narrow_float(ctx: Decomposer, x: UOp) -> UOp | None:
    """half/bfloat16/fp8 arithmetic the renderer can't do natively: compute in float32, round back."""
    dt = x.dtype.scalar() if x.op not in GroupOp.Comparison else x.src[0].dtype.scalar()
    if dt not in (dtypes.float16, dtypes.bfloat16) and not dtypes.is_fp8(dt):
        return None
    if ctx.renderer.supports(x.op, dt):  # (comparisons always are: the flags cover arithmetic only)
        return None
    f32 = dtypes.float32.vec(x.dtype.count)
    srcs = tuple(s if (x.op is Ops.WHERE and i == 0) else s.cast(dtypes.float32.vec(s.dtype.count))
                 for i, s in enumerate(x.src))  # fmt: skip
    if x.op in GroupOp.Comparison:
        return UOp(x.op, x.dtype, srcs, x.arg)
    return UOp(x.op, f32, srcs, x.arg).cast(x.dtype)


def _mulacc(ctx: Decomposer, x: UOp) -> UOp | None:
    if not ctx.lacks(Ops.MULACC, x.dtype):
        return None
    a, b, c = x.src
    return a * b + c


def _pow(ctx: Decomposer, x: UOp) -> UOp | None:
    if not ctx.lacks(Ops.POW, x.dtype) or not dtypes.is_float(x.dtype):
        return None
    return tr.pow_via_exp2(x.src[0], x.src[1])


def _threefry(ctx: Decomposer, x: UOp) -> UOp | None:
    if not ctx.lacks(Ops.THREEFRY, x.dtype):
        return None
    return threefry2x32(x.src[0], x.src[1])


def _transcendental(ctx: Decomposer, x: UOp) -> UOp | None:
    dt = x.dtype.scalar()
    if dt not in (dtypes.float32, dtypes.float64) or not ctx.lacks(x.op, x.dtype):
        return None
    fn = {Ops.EXP2: tr.exp2, Ops.LOG2: tr.log2, Ops.SIN: tr.sin}[x.op]
    return fn(x.src[0])


def threefry2x32(x: UOp, key: UOp) -> UOp:
    """THREEFRY on uint64 counter x and key, in 32-bit integer ops: speck.uop's `threefry_rounds` on uint32 UOps."""
    u32, u64 = dtypes.uint32.vec(x.dtype.count), dtypes.uint64.vec(x.dtype.count)

    def lo(v: UOp) -> UOp:
        return (v & UOp.const(u64, 0xFFFFFFFF)).cast(u32)

    def hi(v: UOp) -> UOp:
        return (v >> UOp.const(u64, 32)).cast(u32)

    def rotl(v: UOp, r: int) -> UOp:
        return (v << UOp.const(u32, r)) | (v >> UOp.const(u32, 32 - r))

    y0, y1 = threefry_rounds(lo(x), hi(x), lo(key), hi(key), rotl, lambda v: v)
    out: UOp = (y1.cast(u64) << UOp.const(u64, 32)) | y0.cast(u64)
    return out


def _fold_const_vector(a: UOp) -> UOp | None:
    """An ALU op on vectors of constants (STACKs of CONSTs, from expansion or decomposition) is a vector constant."""
    if a.dtype.count == 1 or not all(s.op is Ops.STACK and all(x.op is Ops.CONST for x in s.src) for s in a.src):
        return None
    lanes = [UOp(a.op, a.dtype.scalar(), tuple(s.src[i] for s in a.src), a.arg) for i in range(a.dtype.count)]
    folded = [fold_alu(x) for x in lanes]
    if any(f is None for f in folded):
        return None
    return UOp.stack(*folded)  # type: ignore[arg-type]


# exact constant folding only (no reassociation): decompositions and expansion build constant subexpressions
pm_fold_consts = PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="a", src=UPat(Ops.CONST)), fold_alu),
        (UPat(GroupOp.ALU, name="a", src=UPat(Ops.STACK)), _fold_const_vector),
        (UPat(Ops.CAST, name="c", src=(UPat(Ops.CONST, name="x"),)), fold_cast),
    ]
)

pm_decompose = pm_fold_consts + PatternMatcher(
    [
        (UPat(GroupOp.ALU, name="x"), _promote_narrow_float),
        (UPat(Ops.MULACC, name="x"), _mulacc),
        (UPat(Ops.POW, name="x"), _pow),
        (UPat(Ops.THREEFRY, name="x"), _threefry),
        (UPat((Ops.EXP2, Ops.LOG2, Ops.SIN), name="x"), _transcendental),
    ]
)
