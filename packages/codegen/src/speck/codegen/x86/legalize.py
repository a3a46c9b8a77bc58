"""Legalization of a linear program (KERNEL_CONTRACT.md section 2) before x86-64 instruction selection.

Selection handles one UOp at a time from a small set of shapes; this pass brings the program into that set and
checks that every value has a type the backend can hold:
- bool arithmetic becomes the bitwise op it means (ADD/MAX -> OR, MUL -> AND, SUB -> XOR), RECIPROCAL becomes a
  division of a casted 1.0, TRUNC of an integer is the integer itself (rewrite table `pm_x86_legalize`);
- every value's dtype must be one the backend has registers for (bool, 8..64-bit ints, float32, float64);
  anything else raises X86UnsupportedError (an UnsupportedOpError) naming the op, dtype and kernel before any
  further work, so nothing is ever emitted silently wrong and the caller may take another backend for the kernel;
- every memory index becomes ADD(shared part, literal) (`split_index_constants`).
Gated loads/stores and bool WHERE conditions are legalized during selection (they need registers): a gated access
first picks its address (the real one, or a scratch stack slot in the red zone below rsp) with CMOVcc, and a WHERE
whose condition is a bool value (not a comparison) tests it against integer 0.
"""

from __future__ import annotations

from typing import Any

from speck.codegen.errors import X86UnsupportedError
from speck.uop import AddrSpace, DType, Ops, PatternMatcher, PtrDType, UOp, UPat, dtypes

# enum members read in the per-node loops below, as module constants: in Python 3.11 each `Ops.X` goes through the
# enum metaclass's __getattr__ hook, several times the cost of reading a global
_CONST, _CAST, _INDEX, _ADD, _MUL, _SHL, _REG = Ops.CONST, Ops.CAST, Ops.INDEX, Ops.ADD, Ops.MUL, Ops.SHL, AddrSpace.REG

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


def _refusal(u: UOp, bad: DType, kernel: str) -> X86UnsupportedError:
    return X86UnsupportedError(
        f"x86 backend: no selection rule for {u.op.name} on {bad} in kernel {kernel!r}; the x86 backend handles "
        f"{', '.join(sorted(d.name for d in SUPPORTED_SCALARS))} (use the CPU/LLVM device for half, bfloat16 and fp8)",
        u.op,
        bad,
    )


def check_dtypes(uops: list[UOp], kernel: str) -> None:
    """Raise X86UnsupportedError (naming op, dtype and kernel) for the first value without a register class: the
    renderer's early refusal, before the kernel is handed to the compiler (legalize checks the same)."""
    for u in uops:
        if u.op is not _CONST and (_NO_REGISTER.get(u.dtype) is not False or u.op in _OPERAND_CHECKED):
            bad = unsupported_dtype(u)
            if bad is not None:
                raise _refusal(u, bad, kernel)


def legalize(uops: list[UOp], kernel: str) -> list[UOp]:
    """Apply `pm_x86_legalize` to each UOp of a linear program (sources first, so rewritten nodes are seen by their
    users) and check every dtype; returns the new linear list. Raises X86UnsupportedError naming op, dtype and kernel
    for a dtype without a register class."""
    out: list[UOp] = []
    seen: set[UOp] = set()
    new: dict[UOp, UOp] = {}  # only the nodes that changed (most programs have none or a few)
    rules = pm_x86_legalize.op_table()  # op -> matcher: ops without a rule (nearly all) skip the matcher entirely
    for u in uops:
        # the full check only where it can fail: a dtype not yet known to have registers, or an op whose operand
        # dtypes are checked too (most UOps have a dtype seen before and are settled by one lookup)
        ok = u.op is _CONST or (_NO_REGISTER.get(u.dtype) is False and u.op not in _OPERAND_CHECKED)
        bad = None if ok else unsupported_dtype(u)
        if bad is not None:
            raise _refusal(u, bad, kernel)
        nu = u
        if new and not new.keys().isdisjoint(u.src):
            nu = u.replace(src=tuple([new.get(s, s) for s in u.src]))
        rule = rules.get(nu.op)
        if rule is not None and (r := rule(nu, None)) is not None:
            nu = r
        if nu is not u:
            new[u] = nu
        if nu not in seen:
            seen.add(nu)
            out.append(nu)
    return split_index_constants(out)


# ---------------------------------------------------------------------------------------------------------------------
# index expressions: shared part + constant displacement

_INDEX_INTS = frozenset({dtypes.int32, dtypes.int64})
MAX_DISPLACEMENT = 1 << 24  # constants split off an index stay far from int32 overflow (elements, before scaling)


def _affine(u: UOp, memo: dict[UOp, tuple[dict[UOp, int], int]]) -> tuple[dict[UOp, int], int]:
    """u as sum(coef * leaf) + const over its ADD / MUL-by-literal / SHL-by-literal structure (any other node is a
    leaf). Coefficients are exact integers; the caller wraps them to u's width."""
    if (got := memo.get(u)) is not None:
        return got
    res: tuple[dict[UOp, int], int]
    if (lit := _literal(u)) is not None:
        res = ({}, lit)
    elif u.op is _ADD and u.dtype in _INDEX_INTS:
        (ta, ca), (tb, cb) = _affine(u.src[0], memo), _affine(u.src[1], memo)
        terms = dict(ta)
        for leaf, v in tb.items():
            terms[leaf] = terms.get(leaf, 0) + v
        res = ({leaf: v for leaf, v in terms.items() if v}, ca + cb)
    elif (u.op is _MUL or u.op is _SHL) and u.dtype in _INDEX_INTS and (k := _literal(u.src[1])) is not None:
        f = k if u.op is _MUL else (1 << k if 0 <= k < 32 else None)
        if f is None:
            res = ({u: 1}, 0)
        else:
            t, c = _affine(u.src[0], memo)
            res = ({x: v * f for x, v in t.items() if v * f}, c * f)
    else:
        res = ({u: 1}, 0)
    memo[u] = res
    return res


def _literal(u: UOp) -> int | None:
    """The value of an integer casted const, else None."""
    if u.op is _CAST and u.src[0].op is _CONST and isinstance(u.src[0].arg, int):
        return int(u.src[0].arg)
    return None


def _wrap(v: int, dt: DType) -> int:
    bits = 8 * dt.itemsize
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def _place(x: UOp, pos: dict[UOp, int], placed: dict[UOp, int], insert: dict[int, list[UOp]], before: int) -> UOp:
    """Give a node built from placed values (and literals) its place: right after the last of its sources (literals
    have none: selection materialises them at each use). UOps are interned, so the node may already exist in the
    program, but only after the access at position `before` needs it (another index expression of an unrolled
    block builds the same product later): such a node is moved up to its place (it is pure, and its users all come
    after it)."""
    if x not in placed and (x not in pos or pos[x] >= before):
        placed[x] = max(placed[y] if y in placed else pos[y] for y in x.src if not _is_literal(y))
        insert.setdefault(placed[x], []).append(x)
    return x


def _is_literal(u: UOp) -> bool:
    return u.op is _CAST and u.src[0].op is _CONST


def split_index_constants(uops: list[UOp]) -> list[UOp]:
    """Rewrite the index of every memory access as ADD(shared, literal): the part that depends on values is built
    once in a canonical order (so the lanes of an upcast block, which differ only by constants, share one register)
    right after the last value it needs (as early as the loops allow), and the literal becomes the addressing mode's
    displacement. Index nodes nothing reads any more are dropped."""
    pos = {u: i for i, u in enumerate(uops)}
    memo: dict[UOp, tuple[dict[UOp, int], int]] = {}
    insert: dict[int, list[UOp]] = {}  # new nodes, to go right after uops[i]
    placed: dict[UOp, int] = {}  # new node -> the index of the uop it goes right after
    rewrite: dict[UOp, UOp] = {}
    shared: dict[tuple[Any, ...], UOp] = {}  # (dtype, *terms) -> the shared part built for them
    literals: dict[tuple[int, DType], UOp] = {}

    def literal(v: int, dt: DType) -> UOp:
        if (lit := literals.get((v, dt))) is None:
            lit = literals[(v, dt)] = UOp.cconst(v, dt)
        return lit

    for u in uops:
        if u.op is not _INDEX or len(u.src) < 2 or (i := u.src[1]).dtype not in _INDEX_INTS:
            continue
        buf = u.src[0].dtype
        if not isinstance(buf, PtrDType) or buf.addrspace is _REG:
            continue
        terms, const = _affine(i, memo)
        const = _wrap(const, i.dtype)
        if not terms or abs(const) >= MAX_DISPLACEMENT:
            continue
        # built in a canonical order; each new node goes right after the last of its sources (literals need no
        # place: selection materialises them where they are used)
        # the lanes of an upcast block have the same terms: their shared part is built once
        key = (i.dtype, *terms.items())
        acc = shared.get(key)
        at = pos[u]
        if acc is None:
            for leaf in sorted(terms, key=pos.__getitem__):
                coef = _wrap(terms[leaf], i.dtype)
                t = (
                    leaf
                    if coef == 1
                    else _place(UOp(_MUL, i.dtype, (leaf, literal(coef, i.dtype))), pos, placed, insert, at)
                )
                acc = t if acc is None else _place(UOp(_ADD, i.dtype, (acc, t)), pos, placed, insert, at)
            assert acc is not None
            shared[key] = acc
        new_i = _place(UOp(_ADD, i.dtype, (acc, literal(const, i.dtype))), pos, placed, insert, at) if const else acc
        if new_i is i:
            continue
        rewrite[u] = UOp(u.op, u.dtype, (u.src[0], new_i, *u.src[2:]), u.arg, u.tag)
    if not rewrite:
        return uops
    out: list[UOp] = []
    swapped: dict[UOp, UOp] = {}
    for k, u in enumerate(uops):
        nu = rewrite.get(u, u)
        if swapped and not swapped.keys().isdisjoint(nu.src):  # (a set operation: no generator per node)
            nu = UOp(nu.op, nu.dtype, tuple([swapped.get(s, s) for s in nu.src]), nu.arg, nu.tag)
        if nu is not u:
            swapped[u] = nu
        if u not in placed:  # (a node moved up is in `insert` at its new place)
            out.append(nu)
        if k in insert:
            out += insert[k]
    # drop index arithmetic nothing reads any more (users come after their sources: one backward pass)
    used: set[UOp] = set()
    keep: list[UOp] = []
    for u in reversed(out):
        if u not in used and u.dtype in _INDEX_INTS and u.op in _PURE_INDEX_OPS:
            continue
        used.update(u.src)
        keep.append(u)
    keep.reverse()
    return keep


_PURE_INDEX_OPS = frozenset({Ops.ADD, Ops.MUL, Ops.SHL, Ops.SUB, Ops.CAST})


__all__ = [
    "SUPPORTED_SCALARS", "X86UnsupportedError", "check_dtypes", "legalize", "pm_x86_legalize", "split_index_constants",
    "unsupported_dtype",
]  # fmt: skip
