"""Index expressions as affine forms: sum(coefficient * term) + constant. The scheduler compares and rebuilds index
expressions with it; the vector expander recognises contiguous lanes with it."""

from __future__ import annotations

from speck.uop.ops import Ops
from speck.uop.uop import UOp


def linear_terms(x: UOp) -> tuple[dict[UOp, int], int]:
    """x as ({term: coefficient}, constant), flattening ADD, SUB, NEG and products with integer constants; any other
    node (a range, a variable, a division, a product of two variables) is a term of its own. Terms whose
    coefficients cancel are left out."""
    terms: dict[UOp, int] = {}
    const = 0
    stack: list[tuple[UOp, int]] = [(x, 1)]
    while stack:
        u, c = stack.pop()
        if u.op is Ops.CONST and isinstance(u.arg, int) and not isinstance(u.arg, bool):
            const += c * u.arg
        elif u.op is Ops.ADD:
            stack.extend((s, c) for s in u.src)
        elif u.op is Ops.SUB:
            stack.extend(((u.src[0], c), (u.src[1], -c)))
        elif u.op is Ops.NEG:
            stack.append((u.src[0], -c))
        elif u.op is Ops.MUL and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int):
            stack.append((u.src[0], c * u.src[1].arg))
        elif u.op is Ops.MUL and u.src[0].op is Ops.CONST and isinstance(u.src[0].arg, int):
            stack.append((u.src[1], c * u.src[0].arg))
        else:
            terms[u] = terms.get(u, 0) + c
    return {t: k for t, k in terms.items() if k != 0}, const


__all__ = ["linear_terms"]
