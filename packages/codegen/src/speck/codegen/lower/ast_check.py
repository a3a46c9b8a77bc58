"""Checks that a kernel AST follows the conventions of KERNEL_CONTRACT.md section 1 before lowering starts, and the
clean-up every stage relies on afterwards (ranges folded to constants by simplification leave END/REDUCE)."""

from __future__ import annotations

from speck.codegen.errors import ProgramFormError
from speck.uop import AxisType, GroupOp, PatternMatcher, PtrDType, UOp, UPat
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)

_AST_OPS = frozenset(
    {Ops.SINK, Ops.END, Ops.STORE, Ops.INDEX, Ops.PARAM, Ops.LOAD, Ops.CONST, Ops.DEFINE_VAR, Ops.RANGE, Ops.CAST,
     Ops.BITCAST, Ops.REDUCE, Ops.GROUP, Ops.STACK, Ops.GEP, Ops.AFTER, Ops.DEFINE_REG}
) | GroupOp.ALU  # fmt: skip


def convention_error(stage: str, u: UOp, expected: str) -> ProgramFormError:
    """The error every stage raises for an AST that breaks the kernel conventions: names node, stage and rule."""
    return ProgramFormError(
        f"kernel AST convention violated (stage {stage!r}): node {u.op.name} dtype={u.dtype!r} arg={u.arg!r} with "
        f"{len(u.src)} sources: expected {expected}. See packages/codegen/README.md 'Kernel AST conventions'."
    )


def check_kernel_ast(ast: UOp, stage: str = "verify_ast") -> None:
    """Raise RuntimeError (naming node and stage) unless `ast` is a SINK of STOREs into PARAM buffers over RANGEs
    (a buffer may be read after stores into it through AFTER: kernels written by hand accumulate that way)."""
    if ast.op is not Ops.SINK:
        raise convention_error(stage, ast, "a SINK at the root")
    axis_ids: dict[int, UOp] = {}
    for u in ast.toposort():
        if u.op not in _AST_OPS:
            raise convention_error(stage, u, f"only kernel-level ops ({', '.join(sorted(o.name for o in _AST_OPS))})")
        if u.op is Ops.RANGE:
            if not (isinstance(u.arg, tuple) and len(u.arg) >= 2 and isinstance(u.arg[-1], AxisType)):
                raise convention_error(stage, u, "RANGE arg = (axis_id, ..., AxisType)")
            for a in u.arg[:-1]:
                if a in axis_ids and axis_ids[a] is not u:
                    raise convention_error(stage, u, f"unique axis ids (axis {a} is used by two different RANGEs)")
                axis_ids[a] = u
        elif u.op is Ops.STORE:
            if u.src[0].op is not Ops.INDEX or not isinstance(u.src[0].src[0].dtype, PtrDType):
                raise convention_error(stage, u, "STORE(INDEX(PARAM buffer, idx), value)")
        elif u.op is Ops.INDEX:
            if _buffer_of(u.src[0]).op not in _BUFFERS or not isinstance(u.src[0].dtype, PtrDType):
                raise convention_error(stage, u, "INDEX into a PARAM or DEFINE_REG (or an AFTER of one) whose dtype "
                                       "is a pointer")  # fmt: skip
        elif u.op is Ops.AFTER:
            if not isinstance(u.dtype, PtrDType) or _buffer_of(u).op not in _BUFFERS:
                raise convention_error(stage, u, "AFTER(PARAM or DEFINE_REG, *effects): a buffer read after its writes")
        elif u.op is Ops.END:
            if any(r.op is not Ops.RANGE for r in u.src[1:]):
                raise convention_error(stage, u, "END(effect, *RANGEs)")
        elif u.op is Ops.REDUCE:
            if u.arg not in (Ops.ADD, Ops.MUL, Ops.MAX) or any(r.op is not Ops.RANGE for r in u.src[1:]):
                raise convention_error(stage, u, "REDUCE(value, *RANGEs, arg=Ops.ADD|MUL|MAX)")
    for s in ast.src:
        if s.op not in (Ops.END, Ops.STORE, Ops.GROUP):
            raise convention_error(stage, s, "SINK sources that are END(STORE(...), *ranges) or STORE")


_BUFFERS = (Ops.PARAM, Ops.DEFINE_REG)


def _buffer_of(u: UOp) -> UOp:
    """The buffer under AFTERs: a kernel written by hand reads a buffer (or a register accumulator) after its own
    stores (`AFTER(PARAM, STORE...)`), which the linearizer orders like the accumulators reduce lowering makes."""
    while u.op is Ops.AFTER:
        u = u.src[0]
    return u


def _drop_folded_ranges(x: UOp) -> UOp | None:
    """Simplification turns one-iteration RANGEs into CONST 0; END and REDUCE then just forget them."""
    keep = tuple(r for r in x.src[1:] if r.op is Ops.RANGE)
    if len(keep) == len(x.src) - 1:
        return None
    if not keep:
        return x.src[0]
    return x.replace(src=(x.src[0], *keep))


pm_cleanup_ranges = PatternMatcher([(UPat((Ops.END, Ops.REDUCE), name="x"), _drop_folded_ranges)], pure=True)
