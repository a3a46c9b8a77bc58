"""Index expressions as affine forms: sum(coefficient * term) + constant. The scheduler compares and rebuilds index
expressions with it; the vector expander recognises contiguous lanes with it."""

from __future__ import annotations

from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)
from speck.uop.uop import UOp

AffineForm = tuple[dict[UOp, int], int]

_MEMO_LIMIT = 20_000  # forms remembered before starting afresh (they keep their nodes alive)
_memo: dict[UOp, AffineForm] = {}


def _int_const(u: UOp) -> bool:
    return u.op is Ops.CONST and isinstance(u.arg, int) and not isinstance(u.arg, bool)


def _parts(u: UOp) -> tuple[tuple[UOp, int], ...] | None:
    """The (source, coefficient) pairs u is a linear combination of, or None when u is a term or a constant."""
    if u.op is Ops.ADD:
        return tuple((s, 1) for s in u.src)
    if u.op is Ops.SUB:
        return ((u.src[0], 1), (u.src[1], -1))
    if u.op is Ops.NEG:
        return ((u.src[0], -1),)
    if u.op is Ops.MUL and _int_const(u.src[1]):
        return ((u.src[0], u.src[1].arg),)
    if u.op is Ops.MUL and _int_const(u.src[0]):
        return ((u.src[1], u.src[0].arg),)
    return None


def linear_terms(x: UOp) -> AffineForm:
    """x as ({term: coefficient}, constant), flattening ADD, SUB, NEG and products with integer constants; any other
    node (a range, a variable, a division, a product of two variables) is a term of its own. Terms whose
    coefficients cancel are left out.

    Forms are memoized per node (the lanes of an expanded index share most of their subexpressions, and contiguity
    checks ask for every lane): the returned dict is shared, never mutate it."""
    global _memo
    memo = _memo
    hit = memo.get(x)
    if hit is not None:
        return hit
    if len(memo) > _MEMO_LIMIT:
        memo = _memo = {}
    stack: list[tuple[UOp, bool]] = [(x, False)]
    while stack:
        u, ready = stack.pop()
        if u in memo:
            continue
        parts = _parts(u)
        if parts is None:
            memo[u] = ({}, u.arg) if _int_const(u) else ({u: 1}, 0)
            continue
        if not ready:
            stack.append((u, True))
            stack.extend((s, False) for s, _ in parts if s not in memo)
            continue
        terms: dict[UOp, int] = {}
        const = 0
        for s, c in parts:
            st, sc = memo[s]
            const += c * sc
            for t, k in st.items():
                terms[t] = terms.get(t, 0) + c * k
        memo[u] = ({t: k for t, k in terms.items() if k != 0}, const)
    return memo[x]


__all__ = ["AffineForm", "linear_terms"]
