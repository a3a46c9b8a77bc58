"""Specs: which UOps may appear at each stage, as rule tables, and `type_verify` that checks a graph against one.

A spec is a PatternMatcher whose functions return True (the node is well formed), a str (it is malformed: the
string says why) or None (this rule does not decide; the next one is tried). A node no rule accepts is malformed
too. `spec_tensor` covers tensor graphs, `spec_kernel` the kernel AST the scheduler hands to codegen and
`spec_program` the linear program renderers consume (KERNEL_CONTRACT sections 1 and 2)."""

from __future__ import annotations

from typing import Any

from speck.uop.dtype import DType, InvalidType, PtrDType, dtypes
from speck.uop.errors import SpecError
from speck.uop.ops import GroupOp, Ops
from speck.uop.uop import AxisType, UOp
from speck.uop.upat import PatternMatcher, UPat

Verdict = bool | str | None


# ---------------- rules shared by every stage ----------------
def _alu(x: UOp) -> Verdict:
    """ALU ops: the right number of sources, sources of the result dtype (comparisons: bool result of equal-typed
    sources; WHERE: a bool condition and two branches of the result dtype)."""
    op, src, dt = x.op, x.src, x.dtype
    want = 1 if op in GroupOp.Unary else 3 if op in GroupOp.Ternary else 2
    if len(src) != want:
        return f"{op.name} takes {want} source(s), found {len(src)}"
    if op is Ops.WHERE:
        if src[0].dtype.scalar() is not dtypes.bool:
            return f"WHERE condition must be bool, found {src[0].dtype}"
        if src[1].dtype is not dt or src[2].dtype is not dt:
            return f"WHERE branches must both be {dt}, found {src[1].dtype} and {src[2].dtype}"
        return True
    if op in GroupOp.Comparison:
        if src[0].dtype is not src[1].dtype:
            return f"{op.name} sources must share a dtype, found {src[0].dtype} and {src[1].dtype}"
        if dt.scalar() is not dtypes.bool or dt.count != src[0].dtype.count:
            return f"{op.name} must produce bool with the sources' lane count, found {dt}"
        return True
    if op is Ops.THREEFRY:
        ok = dt.scalar() is dtypes.uint64 and all(s.dtype is dt for s in src)
        return True if ok else f"THREEFRY is uint64 (or a uint64 vector) with sources of its dtype, found {dt}"
    if op in (Ops.SHL, Ops.SHR):
        if src[0].dtype is not dt or not (dtypes.is_int(src[1].dtype) and src[1].dtype.count == dt.count):
            return f"{op.name} shifts a {dt} value by an int amount, found {src[0].dtype} and {src[1].dtype}"
        return True
    for s in src:
        if s.dtype is not dt:
            return f"{op.name} sources must all be {dt} (the result dtype), found {[str(s.dtype) for s in src]}"
    return True


def _cast(x: UOp) -> Verdict:
    if len(x.src) != 1:
        return f"{x.op.name} takes 1 source, found {len(x.src)}"
    if x.op is Ops.BITCAST:
        s = x.src[0].dtype
        if s.is_weak or x.dtype.is_weak:
            return f"BITCAST needs concrete dtypes, found {s} -> {x.dtype}"
        if s.nbytes != x.dtype.nbytes:
            return f"BITCAST must keep the size, found {s} ({s.nbytes} bytes) -> {x.dtype} ({x.dtype.nbytes} bytes)"
    return True


def _const(x: UOp) -> Verdict:
    if isinstance(x.arg, InvalidType):
        return True if dtypes.is_int(x.dtype) else f"Invalid is an index value, found it with dtype {x.dtype}"
    if x.dtype.count != 1 or isinstance(x.dtype, PtrDType):
        return f"CONST must be scalar (vectors are STACKs of consts), found {x.dtype}"
    if x.dtype is dtypes.bool and type(x.arg) is not bool:
        return f"bool CONST must hold a bool, found {x.arg!r}"
    if dtypes.is_int(x.dtype) and type(x.arg) is not int:
        return f"int CONST must hold an int, found {x.arg!r}"
    if dtypes.is_float(x.dtype) and type(x.arg) is not float:
        return f"float CONST must hold a float, found {x.arg!r}"
    return True


def _stack(x: UOp) -> Verdict:
    if not x.src or any(s.dtype is not x.src[0].dtype for s in x.src):
        return "STACK sources must be non-empty and share a dtype"
    if x.dtype is not x.src[0].dtype.vec(len(x.src)):
        return (
            f"STACK of {len(x.src)} {x.src[0].dtype} must have dtype {x.src[0].dtype.vec(len(x.src))}, found {x.dtype}"
        )
    return True


def _gep(x: UOp) -> Verdict:
    if len(x.src) != 1 or not isinstance(x.arg, tuple) or not all(isinstance(i, int) for i in x.arg):
        return "GEP takes one vector source and a tuple of lane numbers"
    if not all(0 <= i < x.src[0].dtype.count for i in x.arg):
        return f"GEP lanes {x.arg} out of range for {x.src[0].dtype}"
    return True


def _var(x: UOp) -> Verdict:
    a = x.arg
    if x.src or not (isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], str)):
        return "DEFINE_VAR takes no sources and arg (name, min, max)"
    if not (isinstance(a[1], int) and isinstance(a[2], int) and a[1] <= a[2]):
        return f"DEFINE_VAR bounds must be ints with min <= max, found {a[1:]!r}"
    return True


def _range(x: UOp) -> Verdict:
    if len(x.src) != 1 or not dtypes.is_int(x.src[0].dtype):
        return "RANGE takes one int source (its end)"
    if not dtypes.is_int(x.dtype):
        return f"RANGE must be an int, found {x.dtype}"
    if not (isinstance(x.arg, tuple) and x.arg and isinstance(x.arg[-1], AxisType)):
        return f"RANGE arg must be (axis ids..., AxisType), found {x.arg!r}"
    return True


def _special(x: UOp) -> Verdict:
    if len(x.src) != 1 or not isinstance(x.arg, str):
        return "SPECIAL takes one source (its size) and a name"
    return True


def _bind(x: UOp) -> Verdict:
    if len(x.src) != 2 or x.src[0].op is not Ops.DEFINE_VAR or x.src[1].op is not Ops.CONST:
        return "BIND takes (DEFINE_VAR, CONST)"
    return True


def _sink(x: UOp) -> Verdict:
    return True if x.dtype is dtypes.void else f"SINK must be void, found {x.dtype}"


def _end(x: UOp) -> Verdict:
    if len(x.src) < 2:
        return "END takes the effect and at least one RANGE"
    if any(r.op is not Ops.RANGE for r in x.src[1:]):
        return f"END closes RANGEs, found {[r.op.name for r in x.src[1:]]}"
    return True


def _reduce(x: UOp) -> Verdict:
    if x.arg not in (Ops.ADD, Ops.MUL, Ops.MAX):
        return f"REDUCE arg must be ADD, MUL or MAX, found {x.arg!r}"
    if not x.src or x.src[0].dtype is not x.dtype:
        return "REDUCE's value must have the REDUCE's dtype"
    if any(r.op is not Ops.RANGE for r in x.src[1:]):
        return "REDUCE reduces over RANGEs only"
    return True


def _index(x: UOp) -> Verdict:
    if len(x.src) not in (2, 3):
        return f"INDEX takes (buffer, index[, gate]), found {len(x.src)} sources"
    buf = x.src[0]
    if not isinstance(buf.dtype, PtrDType):
        return f"INDEX needs a pointer buffer, found {buf.dtype}"
    if not dtypes.is_int(x.src[1].dtype):
        return f"INDEX index must be an int, found {x.src[1].dtype}"
    if len(x.src) == 3 and x.src[2].dtype is not dtypes.bool:
        return f"INDEX gate must be bool, found {x.src[2].dtype}"
    if not isinstance(x.dtype, PtrDType) or x.dtype.base is not buf.dtype.base:
        return f"INDEX into {buf.dtype} must be a pointer to {buf.dtype.base}, found {x.dtype}"
    return True


def _elem(idx: UOp) -> DType:
    d = idx.dtype
    return d.base if isinstance(d, PtrDType) else d


def _load(x: UOp) -> Verdict:
    if len(x.src) not in (1, 2) and not (len(x.src) > 2 and all(s.dtype is dtypes.void for s in x.src[2:])):
        return f"LOAD takes (index[, alt]), found {len(x.src)} sources"
    if not isinstance(x.src[0].dtype, PtrDType):
        return f"LOAD reads through a pointer (an INDEX), found {x.src[0].dtype}"
    if x.dtype.scalar() is not _elem(x.src[0]).scalar():
        return f"LOAD from {x.src[0].dtype} must produce {_elem(x.src[0])} (or a vector of it), found {x.dtype}"
    if len(x.src) >= 2 and x.src[1].dtype is not dtypes.void and x.src[1].dtype is not x.dtype:
        return f"LOAD alternative must be {x.dtype}, found {x.src[1].dtype}"
    return True


def _store(x: UOp) -> Verdict:
    if len(x.src) < 2 or x.dtype is not dtypes.void:
        return "STORE takes (index, value) and is void"
    if not isinstance(x.src[0].dtype, PtrDType):
        return f"STORE writes through a pointer (an INDEX), found {x.src[0].dtype}"
    if x.src[1].dtype.scalar() is not _elem(x.src[0]).scalar():
        return f"STORE of {x.src[1].dtype} into {x.src[0].dtype}: the value must have the buffer's element dtype"
    return True


def _param(x: UOp) -> Verdict:
    slot = x.arg[0] if isinstance(x.arg, tuple) else x.arg
    if not isinstance(slot, int) or slot < 0 or x.src:
        return f"PARAM takes no sources and a slot number >= 0, found arg {x.arg!r}"
    return True


def _define_buf(x: UOp) -> Verdict:
    return True if isinstance(x.dtype, PtrDType) else f"{x.op.name} must be a pointer, found {x.dtype}"


_common: list[tuple[UPat, Any]] = [
    (UPat(GroupOp.ALU, name="x"), _alu),
    (UPat((Ops.CAST, Ops.BITCAST), name="x"), _cast),
    (UPat(Ops.STACK, name="x"), _stack),
    (UPat(Ops.GEP, name="x"), _gep),
    (UPat(Ops.DEFINE_VAR, name="x"), _var),
    (UPat(Ops.BIND, name="x"), _bind),
    (UPat(Ops.SINK, name="x"), _sink),
    (UPat((Ops.GROUP, Ops.NOOP, Ops.BARRIER, Ops.CUSTOM, Ops.AFTER)), lambda: True),
]

_kernel_level: list[tuple[UPat, Any]] = [
    (UPat(Ops.RANGE, name="x"), _range),
    (UPat(Ops.SPECIAL, name="x"), _special),
    (UPat(Ops.END, name="x"), _end),
    (UPat(Ops.REDUCE, name="x"), _reduce),
    (UPat(Ops.INDEX, name="x"), _index),
    (UPat(Ops.LOAD, name="x"), _load),
    (UPat(Ops.STORE, name="x"), _store),
    (UPat(Ops.PARAM, name="x"), _param),
    (UPat((Ops.DEFINE_LOCAL, Ops.DEFINE_REG), name="x"), _define_buf),
]


# ---------------- tensor graphs ----------------
def _movement(x: UOp) -> Verdict:
    if len(x.src) != 1:
        return f"{x.op.name} takes 1 source, found {len(x.src)}"
    if x.dtype is not x.src[0].dtype:
        return f"{x.op.name} keeps the dtype {x.src[0].dtype}, found {x.dtype}"
    a = x.arg
    if not isinstance(a, tuple):
        return f"{x.op.name} arg must be a tuple, found {a!r}"
    if x.op is Ops.PERMUTE and x.src[0].has_shape and sorted(a) != list(range(len(x.src[0].shape))):
        return f"PERMUTE order {a} is not a permutation of {len(x.src[0].shape)} axes"
    if x.op in (Ops.PAD, Ops.SHRINK) and not all(isinstance(p, tuple) and len(p) == 2 for p in a):
        return f"{x.op.name} arg must be (before, after) pairs per axis, found {a!r}"
    if x.op is Ops.FLIP and not all(isinstance(f, bool) for f in a):
        return f"FLIP arg must be one bool per axis, found {a!r}"
    if x.op in (Ops.RESHAPE, Ops.EXPAND) and not all(isinstance(d, (int, UOp)) and not isinstance(d, bool) for d in a):
        return f"{x.op.name} shape must be int, found {a!r}"
    return True


def _reduce_axis(x: UOp) -> Verdict:
    a = x.arg
    if len(x.src) != 1 or x.dtype is not x.src[0].dtype:
        return "REDUCE_AXIS takes 1 source of its own dtype"
    if not (isinstance(a, tuple) and len(a) == 2 and a[0] in (Ops.ADD, Ops.MUL, Ops.MAX) and isinstance(a[1], tuple)):
        return f"REDUCE_AXIS arg must be (ADD|MUL|MAX, axes), found {a!r}"
    return True


def _copy(x: UOp) -> Verdict:
    if len(x.src) not in (1, 2) or x.dtype is not x.src[0].dtype:
        return "COPY takes (value[, DEVICE]) and keeps the dtype"
    if len(x.src) == 2 and x.src[1].op is not Ops.DEVICE:
        return f"COPY's second source must be a DEVICE, found {x.src[1].op.name}"
    return True


def _buffer(x: UOp) -> Verdict:
    if not isinstance(x.arg, int) or x.arg < 0:
        return f"BUFFER arg must be its size in elements (int >= 0), found {x.arg!r}"
    if any(s.op not in (Ops.UNIQUE, Ops.DEVICE) for s in x.src):
        return f"BUFFER sources are UNIQUE and DEVICE, found {[s.op.name for s in x.src]}"
    return True


def _same_dtype_1(x: UOp) -> Verdict:
    if not x.src or x.dtype is not x.src[0].dtype:
        return f"{x.op.name} keeps its first source's dtype"
    return True


def _check(x: UOp) -> Verdict:
    if len(x.src) != 2 or x.dtype is not x.src[0].dtype or x.src[1].op is not Ops.BUFFER:
        return "CHECK takes (value, BUFFER recording a violation) and keeps the value's dtype"
    if not (isinstance(x.arg, tuple) and len(x.arg) == 5 and all(isinstance(a, int) or a is None for a in x.arg)):
        return f"CHECK arg must be (op code, low, high, dim, allowed value or None), found {x.arg!r}"
    return True


spec_tensor = PatternMatcher(
    _common
    + [
        (UPat(Ops.CONST, name="x"), _const),
        (UPat(GroupOp.Movement, name="x"), _movement),
        (UPat(Ops.REDUCE_AXIS, name="x"), _reduce_axis),
        (UPat(Ops.COPY, name="x"), _copy),
        (UPat(Ops.BUFFER, name="x"), _buffer),
        (UPat(Ops.CHECK, name="x"), _check),
        (UPat((Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN, Ops.BUFFERIZE), name="x"), _same_dtype_1),
        (UPat((Ops.UNIQUE, Ops.DEVICE, Ops.KERNEL)), lambda: True),
    ]
    + _kernel_level,
    compiled=False,
)
"""What may appear in a tensor graph: movement ops, REDUCE_AXIS, COPY, BUFFER, weak consts and everything else."""

spec_kernel = PatternMatcher(
    _common + [(UPat(Ops.CONST, name="x"), _const)] + _kernel_level,
    compiled=False,
)
"""The kernel AST of KERNEL_CONTRACT section 1: no movement ops; strongly typed and weak (index) consts allowed."""


# ---------------- programs ----------------
def _no_weak(x: UOp) -> Verdict:
    """Only the inner CONST of a casted const may be weak in a program."""
    if x.op is not Ops.CONST and x.dtype.is_weak:
        return f"weak dtype {x.dtype} in a program (only the inner CONST of a casted const may be weak)"
    return None


def _program_const(x: UOp, ctx: dict[UOp, list[UOp]]) -> Verdict:
    if isinstance(x.arg, InvalidType):
        return "Invalid in a program (gates must be lowered to 3-source INDEX)"
    if x.dtype is not dtypes.from_py(x.arg):
        want = dtypes.from_py(x.arg)
        return f"a literal in a program is a casted const: the inner CONST must be {want}, found {x.dtype}"
    users = ctx.get(x, [])
    if not users or any(u.op is not Ops.CAST or u.dtype.is_weak for u in users):
        return "every literal in a program must be casted: CAST(dt, CONST(v, from_py(v))), found a bare CONST"
    return True


def _program_cast(x: UOp) -> Verdict:
    if x.dtype.is_weak:
        return f"CAST to weak dtype {x.dtype} in a program"
    if x.src and x.src[0].op is Ops.CONST:
        v = x.src[0].arg
        if dtypes.is_int(x.dtype) and isinstance(v, float):
            return f"casted const: float literal {v!r} for int dtype {x.dtype}"
    return _cast(x)


def _program_shrink(x: UOp) -> Verdict:
    """A SHRINK of a buffer (a sub-view of a pointer): (buffer[, start], length) with a casted literal length."""
    if len(x.src) not in (2, 3) or not isinstance(x.src[0].dtype, PtrDType):
        return "SHRINK in a program is a buffer view: (buffer[, start], length); movement ops are not allowed"
    ln = x.src[-1]
    if not (ln.op is Ops.CAST and ln.src[0].op is Ops.CONST and type(ln.src[0].arg) is int):
        return f"a SHRINK of a buffer takes a casted literal length, found {ln.op.name}"
    return True


spec_program = PatternMatcher(
    [
        (UPat(GroupOp.All, name="x"), _no_weak),
        (UPat(Ops.CONST, name="x"), _program_const),
        (UPat(Ops.CAST, name="x"), _program_cast),
        (UPat(Ops.SHRINK, name="x"), _program_shrink),
    ]
    + _common
    + _kernel_level,
    compiled=False,
)
"""What codegen may hand to a renderer (KERNEL_CONTRACT section 2): no movement ops, no weak dtypes except the inner
CONST of casted consts (which carries exactly from_py(value)); every literal casted."""


def _users(nodes: list[UOp]) -> dict[UOp, list[UOp]]:
    out: dict[UOp, list[UOp]] = {}
    for u in nodes:
        for s in u.src:
            out.setdefault(s, []).append(u)
    return out


def _describe(u: UOp) -> str:
    srcs = ", ".join(f"{s.op.name}:{s.dtype}" for s in u.src)
    return f"{u.op.name} (dtype {u.dtype}, arg {u.arg!r}, sources [{srcs}])"


def _rule_name(spec: PatternMatcher, u: UOp, ctx: Any) -> tuple[str, Verdict]:
    for pat, fn in spec.rules_for(u.op):
        for store in pat.match(u, {}):
            r = _call(fn, store, ctx)
            if r is not None and r is not True:
                return getattr(fn, "__name__", repr(fn)).lstrip("_"), r
            if r is True:
                return "", True
    return "no rule", None


def _call(fn: Any, store: dict[str, UOp], ctx: Any) -> Verdict:
    code = getattr(fn, "__code__", None)
    wants = code is not None and "ctx" in code.co_varnames[: code.co_argcount]
    r: Verdict = fn(ctx=ctx, **store) if wants else fn(**store)
    return r


def type_verify(root: UOp | list[UOp], spec: PatternMatcher) -> None:
    """Check every node of root (a graph, or a linear list of UOps) against spec; raise RuntimeError naming the first
    malformed node, the rule it breaks and why. Rules that need the whole graph get a node -> users map as ctx."""
    nodes = root.toposort() if isinstance(root, UOp) else list(root)
    users = _users(nodes)
    for i, u in enumerate(nodes):
        name, verdict = _rule_name(spec, u, users)
        if verdict is True:
            continue
        if verdict is None:
            raise SpecError(
                f"type_verify: node {i} {_describe(u)} is not allowed here: no rule of this spec accepts {u.op.name}"
            )
        raise SpecError(f"type_verify: node {i} {_describe(u)} breaks rule '{name}': {verdict}")
