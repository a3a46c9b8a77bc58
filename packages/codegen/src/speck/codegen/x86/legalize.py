"""Legalization of a linear program (KERNEL_CONTRACT.md section 2) before x86-64 instruction selection.

Selection handles one UOp at a time from a small set of shapes; this pass brings the program into that set and
checks that every value has a type the backend can hold:
- bool arithmetic becomes the bitwise op it means (ADD/MAX -> OR, MUL -> AND, SUB -> XOR), RECIPROCAL becomes a
  division of a casted 1.0, TRUNC of an integer is the integer itself (rewrite table `pm_x86_legalize`);
- every value's dtype must be one the backend has registers for (bool, 8..64-bit ints, float32, float64);
  anything else raises RuntimeError naming the op, dtype and kernel, so nothing is ever emitted silently wrong.
Gated loads/stores and bool WHERE conditions are legalized during selection (they need registers): a gated access
first picks its address (the real one, or a scratch stack slot in the red zone below rsp) with CMOVcc, and a WHERE
whose condition is a bool value (not a comparison) tests it against integer 0.
"""

from __future__ import annotations

from speck.uop import DType, Ops, PatternMatcher, PtrDType, UOp, UPat, dtypes

SUPPORTED_SCALARS: frozenset[DType] = frozenset({
    dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
    dtypes.uint64, dtypes.float32, dtypes.float64,
})  # fmt: skip
"""Scalar dtypes with a register class and load/store/ALU/cast rules on x86-64 (half, bfloat16, fp8 have none)."""


def _one(dt: DType) -> UOp:
    return UOp.cconst(1.0, dt)


pm_x86_legalize = PatternMatcher([
    # bool arithmetic is bitwise logic
    (UPat((Ops.ADD, Ops.MAX), dtypes.bool, name="x"), lambda x: x.replace(op=Ops.OR)),
    (UPat(Ops.MUL, dtypes.bool, name="x"), lambda x: x.replace(op=Ops.AND)),
    (UPat(Ops.SUB, dtypes.bool, name="x"), lambda x: x.replace(op=Ops.XOR)),
    # 1/x is a division (vdivss/vdivsd) of a literal one
    (UPat(Ops.RECIPROCAL, name="x"),
     lambda x: UOp(Ops.FDIV, x.dtype, (_one(x.dtype), x.src[0])) if dtypes.is_float(x.dtype) else None),
    # integer TRUNC is the identity
    (UPat(Ops.TRUNC, name="x"), lambda x: x.src[0] if dtypes.is_int(x.dtype) or x.dtype == dtypes.bool else None),
])  # fmt: skip


def unsupported_dtype(u: UOp) -> DType | None:
    """The first value dtype of u (its result, or an operand of a comparison/cast/store) with no register class on
    x86-64, or None. Pointers are not values: a buffer of half is only a problem once something loads from it."""
    if _has_no_register(u.dtype):
        return u.dtype
    if u.op in _OPERAND_CHECKED:
        for s in u.src:
            if _has_no_register(s.dtype):
                return s.dtype
    return None


_OPERAND_CHECKED = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.CAST, Ops.BITCAST, Ops.STORE})
_NO_REGISTER: dict[DType, bool] = {}  # DTypes are interned and immutable: decide each one once


def _has_no_register(dt: DType) -> bool:
    r = _NO_REGISTER.get(dt)
    if r is None:
        ok = isinstance(dt, PtrDType) or dt == dtypes.void or dt.is_weak or dt.scalar() in SUPPORTED_SCALARS
        r = _NO_REGISTER[dt] = not ok
    return r


def legalize(uops: list[UOp], kernel: str) -> list[UOp]:
    """Apply `pm_x86_legalize` to each UOp of a linear program (sources first, so rewritten nodes are seen by their
    users) and check every dtype; returns the new linear list. Raises RuntimeError naming op, dtype and kernel for a
    dtype without a register class."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    new: dict[UOp, UOp] = {}  # only the nodes that changed (most programs have none or a few)
    rules = pm_x86_legalize.op_table()  # op -> matcher: ops without a rule (nearly all) skip the matcher entirely
    for u in uops:
        # the full check only where it can fail: a dtype not yet known to have registers, or an op whose operand
        # dtypes are checked too (most UOps have a dtype seen before and are settled by one lookup)
        ok = u.op is Ops.CONST or (_NO_REGISTER.get(u.dtype) is False and u.op not in _OPERAND_CHECKED)
        bad = None if ok else unsupported_dtype(u)
        if bad is not None:
            raise RuntimeError(
                f"x86 backend: no selection rule for {u.op.name} on {bad} in kernel {kernel!r}; the x86 backend "
                f"handles {', '.join(sorted(d.name for d in SUPPORTED_SCALARS))} (use the CPU/LLVM device for "
                "half, bfloat16 and fp8)"
            )
        nu = u
        if new and any(s in new for s in u.src):
            nu = u.replace(src=tuple([new.get(s, s) for s in u.src]))
        rule = rules.get(nu.op)
        if rule is not None and (r := rule(nu, None)) is not None:
            nu = r
        if nu is not u:
            new[u] = nu
        if nu not in seen:
            seen.add(nu)
            out.append(nu)
    return out


__all__ = ["SUPPORTED_SCALARS", "legalize", "pm_x86_legalize", "unsupported_dtype"]
