"""The symbolic rule set: exact constant folding, algebraic identities, constant combining, comparisons decided by
bounds, and division/modulo folding from bounds. `UOp.simplify()` applies `symbolic` to a fixed point.

Integer division and modulo are CDIV/CMOD: they truncate toward zero like C (-7 // 2 == -3, -7 % 2 == -1), so the
floor-style identities below are only applied where the dividend is known to be non-negative."""

from __future__ import annotations

import math
from typing import Any

from speck.uop.bounds import _compute_bounds
from speck.uop.dtype import ALL_SCALARS, ConstType, DType, Invalid, InvalidType, bitcast, cast_value, dtypes
from speck.uop.errors import UOpValueError
from speck.uop.ops import FastOps as Ops  # Ops' members, read in hot loops (see FastOps)
from speck.uop.ops import GroupOp
from speck.uop.uop import UOp, exec_alu, register_service
from speck.uop.upat import PatternMatcher, UPat

INTS: tuple[DType, ...] = tuple(d for d in ALL_SCALARS if dtypes.is_int(d))
INTS_BOOL: tuple[DType, ...] = INTS + (dtypes.bool,)
FLOATS: tuple[DType, ...] = tuple(d for d in ALL_SCALARS if dtypes.is_float(d))


def _is_const(u: UOp) -> bool:
    return u.op is Ops.CONST and not isinstance(u.arg, InvalidType)


# ---------------- constant folding ----------------
def fold_alu(a: UOp) -> UOp | None:
    """An ALU op whose sources are all constants becomes the constant it computes, at the dtype's exact width."""
    if a.dtype.count != 1 or any(s.dtype.count != 1 for s in a.src):
        return None
    if not all(s.op is Ops.CONST for s in a.src):
        return None
    if a.op in (Ops.CDIV, Ops.CMOD) and a.src[1].arg == 0 and not isinstance(a.src[0].arg, InvalidType):
        return None  # division by zero is left for the program to define (or trap)
    val = exec_alu(a.op, a.dtype if a.op not in GroupOp.Comparison else a.src[0].dtype, [s.arg for s in a.src])
    if a.op in GroupOp.Comparison and not isinstance(val, InvalidType):
        val = bool(val)
    return UOp.const(a.dtype, val)


def fold_cast(c: UOp, x: UOp) -> UOp | None:
    if c.dtype.count != 1 or isinstance(c.dtype, type(None)) or x.dtype.count != 1:
        return None
    if isinstance(x.arg, InvalidType):
        return UOp.const(c.dtype, Invalid)
    return UOp.const(c.dtype, cast_value(x.arg, c.dtype))


def fold_bitcast(c: UOp, x: UOp) -> UOp | None:
    if c.dtype.count != 1 or x.dtype.count != 1 or x.dtype.is_weak or c.dtype.is_weak:
        return None
    if x.dtype.itemsize != c.dtype.itemsize or isinstance(x.arg, InvalidType):
        return None
    return UOp.const(c.dtype, bitcast(x.arg, x.dtype, c.dtype))


def _const_from_bounds(x: UOp) -> UOp | None:
    """An int or bool node whose bounds pin a single value is that value."""
    lo, hi = x._bounds or _compute_bounds(x)
    if lo != hi or x.dtype.count != 1 or (type(lo) is not int and type(lo) is not bool):
        return None
    if x.op in (Ops.RANGE, Ops.SPECIAL) and x.src[0].vmin < 1:
        return None  # a range whose end may be 0 runs zero times: it is not the constant 0
    return UOp.const(x.dtype, lo)


# ---------------- identities ----------------
def _cast_cast(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """cast(cast(x, a), b) -> cast(x, b) when the middle cast loses nothing."""
    from speck.uop.dtype import can_lossless_cast

    if x.dtype.count != 1:
        return None
    if can_lossless_cast(x.dtype, c1.dtype) or (
        dtypes.is_int(x.dtype)
        and dtypes.is_int(c1.dtype)
        and dtypes.min(c1.dtype) <= x.vmin
        and x.vmax <= dtypes.max(c1.dtype)
    ):  # the middle type holds every value x can take (by dtype, or for ints by x's bounds)
        return x.cast(c2.dtype) if x.dtype != c2.dtype else x
    return None


def _neg_cast(x: UOp, k: UOp, c: UOp) -> UOp | None:
    """float->int casts truncate toward zero, so cast(x * -k) == -cast(x * k): lets a.cast(int) + (-a).cast(int)
    fold to 0 (also after -1 was merged into a constant factor of a)."""
    if not (dtypes.is_float(x.dtype) and dtypes.is_int(c.dtype) and not dtypes.is_unsigned(c.dtype)):
        return None
    if type(k.arg) is not float or not k.arg < 0:
        return None
    return (x if k.arg == -1.0 else x * -k.arg).cast(c.dtype) * -1


def _mul_combine(x: UOp, c1: UOp, c2: UOp) -> UOp:
    k: ConstType = exec_alu(Ops.MUL, c1.dtype, [c1.arg, c2.arg])
    return x * k


def _add_combine(x: UOp, c1: UOp, c2: UOp) -> UOp:
    k: ConstType = exec_alu(Ops.ADD, c1.dtype, [c1.arg, c2.arg])
    return x + k


def _like_terms(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    k: ConstType = exec_alu(Ops.ADD, c1.dtype, [c1.arg, c2.arg])
    return x * k


# ---------------- division and modulo ----------------
_MAX_TERMS = 256  # a sum that shares subexpressions can expand exponentially: give up past this many terms


def _split_terms(x: UOp) -> list[tuple[UOp | None, int]] | None:
    """x as a list of (term, coefficient) for an ADD chain of ints; a None term is the constant part (None when
    the chain has more than _MAX_TERMS terms)."""
    out: list[tuple[UOp | None, int]] = []
    stack = [x]
    while stack:
        if len(out) + len(stack) > _MAX_TERMS:
            return None
        u = stack.pop()
        if u.op is Ops.ADD:
            stack.extend(reversed(u.src))  # left to right: the rebuilt sum keeps the input's term order
        elif u.op is Ops.MUL and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int):
            out.append((u.src[0], u.src[1].arg))
        elif u.op is Ops.CONST and isinstance(u.arg, int):
            out.append((None, u.arg))
        else:
            out.append((u, 1))
    return out


def _rebuild(dt: DType, terms: list[tuple[UOp | None, int]]) -> UOp:
    out: UOp | None = None
    const = 0
    for t, c in terms:
        if t is None:
            const += c
            continue
        term = t if c == 1 else t * c
        out = term if out is None else out + term
    if out is None:
        return UOp.const(dt, const)
    return out + const if const != 0 else out


def fold_divmod(d: UOp, x: UOp, c: UOp) -> UOp | None:
    """x // c and x % c for a positive constant c and x >= 0: terms whose coefficient c divides go to the quotient;
    when the rest stays inside [0, c) it is the remainder. A coefficient larger than c splits into a multiple of c
    and the rest. Covers ((x*4)+2) % 4 -> 2, (n*6)//3 -> n*2 and (x + 25*j) % 24 -> x + j for x + j < 24 (the
    windows of Tensor.unfold)."""
    cv = c.arg
    if not isinstance(cv, int) or cv <= 0 or x.vmin < 0 or not dtypes.is_int(x.dtype):
        return None
    if x.vmax < cv:
        return x if d.op is Ops.CMOD else UOp.const(d.dtype, 0)
    terms = _split_terms(x)
    if terms is None:
        return None
    if not x.dtype.is_weak:
        # moving terms across the division is exact only if no partial sum wrapped (bounds alone can't tell an
        # unsigned wrap from a full range)
        worst = sum(abs(k) * (max(abs(t.vmin), abs(t.vmax)) if t is not None else 1) for t, k in terms)
        if worst > dtypes.max(x.dtype):
            return None
    if (common := _fold_common_factor(d, terms, cv)) is not None:
        return common
    quo: list[tuple[UOp | None, int]] = []
    rem: list[tuple[UOp | None, int]] = []
    for t, k in terms:
        if k % cv == 0:
            quo.append((t, k // cv))
        elif t is None or k > cv:  # k = q*c + r: the q part moves to the quotient (x = c*quo + rem either way)
            quo.append((t, k // cv))
            rem.append((t, k % cv))
        else:
            rem.append((t, k))
    if not quo:
        return None
    rem_u = _rebuild(x.dtype, rem)
    if not (rem_u.vmin >= 0 and rem_u.vmax < cv):
        # the remainder part may still carry: x = c*quo + rem with rem >= 0 gives x % c == rem % c and
        # x // c == quo + rem // c ((n*784 + i) // 28 -> n*28 + i // 28, the index of a flattened image)
        if rem_u.vmin < 0 or rem_u is x or any(t is None for t, _ in quo):
            return None
        return rem_u % cv if d.op is Ops.CMOD else _rebuild(x.dtype, quo) + rem_u // cv
    if d.op is Ops.CMOD:
        return rem_u
    return _rebuild(x.dtype, quo)


def _fold_common_factor(d: UOp, terms: list[tuple[UOp | None, int]], cv: int) -> UOp | None:
    """x = g*B + S with g a common factor of c and of the big terms' coefficients, and the small terms S inside
    [0, g): x // c == B // (c/g) and x % c == (B % (c/g))*g + S (x >= 0, checked by the caller). This is the index
    of a 2x2-pooled image read through its flat offset: (20*h + w) // 40 -> h // 2 for w < 20."""
    if any(t is not None and t.vmin < 0 for t, k in terms) or any(k <= 0 for t, k in terms if t is not None):
        return None
    ordered = sorted(terms, key=lambda tk: (tk[0] is not None, tk[1]))  # the constant, then small coefficients
    for split in range(1, len(ordered)):
        small, big = ordered[:split], ordered[split:]
        g = cv
        for _, k in big:
            g = math.gcd(g, k)
        if g <= 1 or g == cv and all(k % cv == 0 for _, k in big):
            continue  # nothing in common, or the plain quotient split (fold_divmod's own case) already applies
        lo = sum(k * (t.vmin if t is not None else 1) for t, k in small)
        hi = sum(k * (t.vmax if t is not None else 1) for t, k in small)
        if lo < 0 or hi >= g:
            continue
        dt = d.dtype
        b = _rebuild(dt, [(t, k // g) for t, k in big])
        if d.op is Ops.CDIV:
            return b // (cv // g)
        return (b % (cv // g)) * g + _rebuild(dt, small)
    return None


def _divmod_term(u: UOp) -> tuple[UOp, int] | None:
    """u as (x // c or x % c, coefficient) when it is one, optionally times a constant."""
    k = 1
    if u.op is Ops.MUL and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int):
        u, k = u.src[0], u.src[1].arg
    if u.op in (Ops.CDIV, Ops.CMOD) and u.src[1].op is Ops.CONST and isinstance(u.src[1].arg, int):
        return u, k
    return None


def fold_scaled_recombine(a: UOp) -> UOp | None:
    """(y % c)*m + (y // c)*(c*m) -> y*m anywhere in a sum (truncating division makes this exact for every y): the
    scaled form of re-flattening an index, e.g. a pooled row's (h % 2)*20 + (h // 2)*40 -> h*20. y // c may appear
    already merged with a division inside y: ((x // 3) % 3)*3 + (x // 9)*9 -> (x // 3)*3 (a (64, 3, 3) weight read
    flat). Tried when the newest term of the sum is a division or modulo, so a long sum is not searched at every
    step."""
    last = _divmod_term(a.src[1])
    if last is None:
        return None
    terms = _split_terms(a)
    if terms is None:
        return None
    dm, k = last
    x, c = dm.src[0], dm.src[1].arg
    if c <= 0:
        return None
    # (partner term, what the pair becomes)
    pairs: list[tuple[tuple[UOp, int], tuple[UOp, int]]] = []
    if dm.op is Ops.CMOD:
        pairs.append(((x // c, k * c), (x, k)))
        if x.op is Ops.CDIV and x.src[1].op is Ops.CONST and isinstance(d := x.src[1].arg, int) and d > 0:
            pairs.append(((x.src[0] // (d * c), k * c), (x, k)))
    else:
        for d in range(1, c):
            if c % d == 0 and k % (c // d) == 0:  # x // c == (x // d) // (c // d)
                y, c2 = (x, c) if d == 1 else (x // d, c // d)
                pairs.append(((y % c2, k // c2), (y, k // c2)))
    for partner, merged in pairs:
        if not merged[0].dtype.is_weak and not _mul_fits(merged[0], merged[1]):
            continue
        rest = list(terms)
        try:  # UOps are interned: == on these tuples compares identity
            rest.remove((dm, k))
            rest.remove(partner)
        except ValueError:
            continue
        return _rebuild(a.dtype, [*rest, merged])
    return None


def _subtracted_sum(u: UOp) -> bool:
    """u is (s1 + s2 + ...)*k for a negative int k: a sum subtracted from another (a - b is a + b*-1)."""
    return u.op is Ops.MUL and u.src[0].op is Ops.ADD and u.src[1].op is Ops.CONST and type(k := u.src[1].arg) is int \
        and k < 0  # fmt: skip


def fold_scaled_sum(a: UOp) -> UOp | None:
    """A sum holding (s1 + s2 + ...)*k, k < 0, where some k*si cancels or merges with another term of the sum:
    (L+1) + (9 - (L+1)) -> 9, the size a symbolic cat padded back to a fixed length. The subtracted sum is spread
    only when that removes a variable term, so sums that don't simplify keep their form. Tried only when a source
    of the ADD is a subtracted sum (rare in index math, whose scaled sums are (x+1)*4), so a long sum is not
    searched at every step."""
    if not (_subtracted_sum(a.src[0]) or _subtracted_sum(a.src[1])):
        return None
    terms = _split_terms(a)
    if terms is None:
        return None
    spread: list[tuple[UOp | None, int]] = []
    groups: list[set[UOp]] = [set()]  # the variable terms outside scaled sums, then those of each scaled sum
    for t, k in terms:
        inner = _split_terms(t) if t is not None and t.op is Ops.ADD else None
        if inner is None or t is None:
            spread.append((t, k))
            if t is not None:
                groups[0].add(t)
            continue
        if not a.dtype.is_weak and not all(s is None or _mul_fits(s, k * c) for s, c in inner):
            return None  # k*si could wrap where k*(sum) did not
        spread.extend((s, k * c) for s, c in inner)
        groups.append({s for s, _ in inner if s is not None})
    if len(set().union(*groups)) == sum(len(g) for g in groups):
        return None  # no term of a scaled sum meets a term outside it
    merged: dict[UOp | None, int] = {}
    for t, k in spread:
        merged[t] = merged.get(t, 0) + k
    return _rebuild(a.dtype, [(t, k) for t, k in merged.items() if k != 0 or t is None])


def fold_sum_terms(a: UOp) -> UOp | None:
    """fold_scaled_recombine, else fold_scaled_sum: each looks at a sum only when a source has its shape."""
    s0, s1 = a.src
    if s1.op in (Ops.CDIV, Ops.CMOD, Ops.MUL) and (r := fold_scaled_recombine(a)) is not None:
        return r
    if (s0.op is Ops.MUL and s0.src[0].op is Ops.ADD) or (s1.op is Ops.MUL and s1.src[0].op is Ops.ADD):
        return fold_scaled_sum(a)
    return None


def _mul_fits(x: UOp, k: int) -> bool:
    """x * k can't wrap: a weak int, or every product of x's range with k fits x's dtype."""
    if x.dtype.is_weak:
        return True
    lo, hi = x.vmin * k, x.vmax * k
    return bool(dtypes.min(x.dtype) <= min(lo, hi) and max(lo, hi) <= dtypes.max(x.dtype))


def fold_div_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """(x // a) // b -> x // (a*b) for positive a, b (true for truncating division of any sign; a*b must fit)."""
    if isinstance(c1.arg, int) and isinstance(c2.arg, int) and c1.arg > 0 and c2.arg > 0:
        k = c1.arg * c2.arg
        if x.dtype.is_weak or k <= dtypes.max(x.dtype):
            return x // k
    return None


def fold_mod_mod(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """(x % a) % b -> x % b when b divides a and x >= 0."""
    if isinstance(c1.arg, int) and isinstance(c2.arg, int) and c2.arg > 0 and c1.arg % c2.arg == 0 and x.vmin >= 0:
        return x % c2.arg
    return None


def _where_same(a: UOp) -> UOp:
    return a


def _lt_const_fold(x: UOp, c: UOp, y: UOp) -> UOp | None:
    """x*c < y for positive c and non-negative x: x < ceil(y/c)."""
    if isinstance(c.arg, int) and c.arg > 0 and y.op is Ops.CONST and isinstance(y.arg, int) and x.vmin >= 0:
        if _mul_fits(x, c.arg):  # a wrapped product compares differently
            return x < -(-y.arg // c.arg)
    return None


def _lt_add_const(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """x + a < b -> x < b - a for weak (non-overflowing) ints."""
    if x.dtype == dtypes.weakint and isinstance(c1.arg, int) and isinstance(c2.arg, int):
        return x < (c2.arg - c1.arg)
    return None


def _is_float_dt(x: UOp) -> bool:
    return dtypes.is_float(x.dtype)


def _invalid_alu(a: UOp) -> UOp | None:
    """Any ALU op on Invalid is Invalid (Invalid // 0 included; a WHERE only when the Invalid can be selected, which
    the constant-condition rules handle)."""
    return UOp.const(a.dtype, Invalid)


_INV = UPat(Ops.CONST, arg=Invalid)
_ANY = UPat()
_invalid_rules: list[tuple[UPat, Any]] = [
    (UPat(GroupOp.Unary, name="a", src=(_INV,)), _invalid_alu),
    (UPat(GroupOp.Binary, name="a", src=(_INV, _ANY)), _invalid_alu),
    (UPat(GroupOp.Binary, name="a", src=(_ANY, _INV)), _invalid_alu),
    (UPat(Ops.MULACC, name="a", src=(_INV, _ANY, _ANY)), _invalid_alu),
    (UPat(Ops.MULACC, name="a", src=(_ANY, _INV, _ANY)), _invalid_alu),
    (UPat(Ops.MULACC, name="a", src=(_ANY, _ANY, _INV)), _invalid_alu),
    (UPat(Ops.WHERE, name="a", src=(_INV, _ANY, _ANY)), _invalid_alu),
]


def _nan_safe_mul_zero(x: UOp) -> UOp | None:
    if dtypes.is_int(x.dtype) or x.dtype.scalar() == dtypes.bool:
        return UOp.const(x.dtype, 0)
    return None


def _sub_self(x: UOp) -> UOp | None:
    return UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None


def _const_right(a: UOp, c: UOp, y: UOp) -> UOp | None:
    """Constants go on the right of commutative ADD/MUL, so one canonical form remains."""
    if a.src[0] is c and y.op is not Ops.CONST:
        return UOp(a.op, a.dtype, (y, c))
    return None


def _move_const_up(x: UOp, c: UOp, y: UOp) -> UOp | None:
    """(x + c) + y -> (x + y) + c so constants collect at the top of a sum."""
    if y.op is Ops.CONST:
        return None
    return (x + y) + c


def _max_bounds(x: UOp, y: UOp) -> UOp | None:
    if not (dtypes.is_int(x.dtype) or dtypes.is_float(x.dtype)):
        return None
    if x.vmin >= y.vmax:
        return x
    if y.vmin >= x.vmax:
        return y
    return None


symbolic_simple = PatternMatcher(
    [
        # constant folding
        *_invalid_rules,
        (UPat(GroupOp.ALU, name="a", src=UPat(Ops.CONST)), fold_alu),
        (UPat(Ops.CAST, name="c", src=(UPat(Ops.CONST, name="x"),)), fold_cast),
        (UPat(Ops.BITCAST, name="c", src=(UPat(Ops.CONST, name="x"),)), fold_bitcast),
        # identities
        (UPat.var("x") + 0, lambda x: x),
        (UPat.var("x") * 1, lambda x: x),
        (UPat.var("x") * 0, _nan_safe_mul_zero),
        (UPat.var("x", INTS) // 1, lambda x: x),
        (UPat.var("x", INTS) % 1, lambda x: UOp.const(x.dtype, 0)),
        (UPat.var("x", INTS) ^ 0, lambda x: x),
        (UPat.var("x", INTS) | 0, lambda x: x),
        (UPat.var("x", INTS) << 0, lambda x: x),
        (UPat.var("x", INTS) >> 0, lambda x: x),
        (UPat.var("x", dtypes.bool) & True, lambda x: x),
        (UPat.var("x", dtypes.bool) | False, lambda x: x),
        (UPat.var("x", dtypes.bool) & False, lambda x: UOp.const(dtypes.bool, False)),
        (UPat.var("x", dtypes.bool) | True, lambda x: UOp.const(dtypes.bool, True)),
        (UPat.var("x", INTS_BOOL) & UPat.var("x"), lambda x: x),
        (UPat.var("x", INTS_BOOL) | UPat.var("x"), lambda x: x),
        (UPat.var("x", INTS).maximum(UPat.var("x")), lambda x: x),
        (UPat.var("x", dtypes.bool).ne(True).ne(True), lambda x: x),
        (UPat.var("x", dtypes.bool).ne(False), lambda x: x),
        (UPat.var("x", INTS_BOOL).ne(UPat.var("x")), lambda x: UOp.const(dtypes.bool.vec(x.dtype.count), False)),
        (UPat.var("x", INTS_BOOL).eq(UPat.var("x")), lambda x: UOp.const(dtypes.bool.vec(x.dtype.count), True)),
        (UPat.var("x", INTS) < UPat.var("x"), lambda x: UOp.const(dtypes.bool.vec(x.dtype.count), False)),
        (UPat.var().where(UPat.var("a"), UPat.var("a")), _where_same),  # fmt: skip
        (UPat.const(dtypes.bool, True).where(UPat.var("a"), UPat.var()), lambda a: a),
        (UPat.const(dtypes.bool, False).where(UPat.var(), UPat.var("b")), lambda b: b),
        (UPat.var("x", INTS) + UPat.var("x") * -1, _sub_self),
        (UPat(Ops.CAST, name="c2", src=(UPat(Ops.CAST, name="c1", src=(UPat.var("x"),)),)), _cast_cast),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x") * UPat.cvar("k"),)), _neg_cast),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), lambda c, x: x if c.dtype == x.dtype else None),
        # constants to the right, then combined
        (UPat((Ops.ADD, Ops.MUL), name="a", src=(UPat(Ops.CONST, name="c"), UPat.var("y"))), _const_right),
        ((UPat.var("x", INTS) + UPat.cvar("c1")) + UPat.cvar("c2"), _add_combine),  # ints only: float rounding
        ((UPat.var("x", INTS) * UPat.cvar("c1")) * UPat.cvar("c2"), _mul_combine),  # ints only: float rounding
        ((UPat.var("x", INTS) + UPat.cvar("c")) + UPat.var("y"), _move_const_up),
        # like terms
        (UPat.var("x", INTS) + UPat.var("x"), lambda x: x * 2),
        (UPat.var("x", INTS) * UPat.cvar("c1") + UPat.var("x") * UPat.cvar("c2"), _like_terms),
        (UPat.var("x", INTS) * UPat.cvar("c1") + UPat.var("x"), lambda x, c1: x * (c1.arg + 1)),
        ((UPat.var("x", INTS) * UPat.cvar("c1")) * -1, lambda x, c1: x * -c1.arg),
        # like terms one step into a sum: (x + y*a) + y*b -> x + y*(a+b), (x + y) + y*b -> x + y*(b+1)
        (
            (UPat.var("x", INTS) + UPat.var("y") * UPat.cvar("c1")) + UPat.var("y") * UPat.cvar("c2"),
            lambda x, y, c1, c2: x + y * (c1.arg + c2.arg) if type(c1.arg) is int and type(c2.arg) is int else None,
        ),
        (
            (UPat.var("x", INTS) + UPat.var("y")) + UPat.var("y") * UPat.cvar("c2"),
            lambda x, y, c2: x + y * (c2.arg + 1) if type(c2.arg) is int else None,
        ),
        (
            (UPat.var("x", INTS) + UPat.var("y") * UPat.cvar("c1")) + UPat.var("y"),
            lambda x, y, c1: x + y * (c1.arg + 1) if type(c1.arg) is int else None,
        ),  # fmt: skip
    ],
    pure=True,
)


def _recombine_patterns() -> list[UPat]:
    mod = UPat.var("x", INTS) % UPat.cvar("c")
    div = (UPat.var("x") // UPat.cvar("c")) * UPat.cvar("c")
    y = UPat.var("y", INTS)
    return [mod + div, div + mod, (y + mod) + div, (y + div) + mod]


_PINNABLE = (GroupOp.ALU - {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL, Ops.XOR}) | {Ops.CAST, Ops.RANGE, Ops.SPECIAL}

symbolic = symbolic_simple + PatternMatcher(
    [
        # bounds decide ints and comparisons
        # (ADD, SUB, MUL, NEG, SHL and XOR are left out: their bounds pin a value only when a source is pinned, and
        # a pinned source was already folded to a CONST, because sources are simplified first)
        (UPat(_PINNABLE, dtype=INTS_BOOL, name="x"), _const_from_bounds),
        (UPat.var("x").maximum(UPat.var("y")), _max_bounds),
        # division and modulo
        (UPat((Ops.CDIV, Ops.CMOD), name="d", src=(UPat.var("x"), UPat.cvar("c"))), fold_divmod),
        ((UPat.var("x", INTS) // UPat.cvar("c1")) // UPat.cvar("c2"), fold_div_div),
        ((UPat.var("x", INTS) % UPat.cvar("c1")) % UPat.cvar("c2"), fold_mod_mod),
        # x % c + (x // c) * c == x for truncating division (also one step into a sum): re-flattening an index
        *[(pat, lambda x, c, y=None: x if y is None else y + x) for pat in _recombine_patterns()],
        # ... and like terms inside a scaled sum: (L+1) + (9 - (L+1)) -> 9 (one rule: a sum is matched once)
        (UPat(Ops.ADD, dtype=INTS, name="a"), fold_sum_terms),
        (
            (UPat.var("x", INTS) * UPat.cvar("c")) // UPat.cvar("c"),
            lambda x, c: x if c.arg != 0 and _mul_fits(x, c.arg) else None,
        ),
        (
            (UPat.var("x", INTS) * UPat.cvar("c")) % UPat.cvar("c"),
            lambda x, c: UOp.const(x.dtype, 0) if c.arg != 0 and _mul_fits(x, c.arg) else None,
        ),  # fmt: skip
        # comparisons
        ((UPat.var("x", INTS) * UPat.cvar("c")) < UPat.var("y"), _lt_const_fold),
        ((UPat.var("x", INTS) + UPat.cvar("c1")) < UPat.cvar("c2"), _lt_add_const),
    ],
    pure=True,
)


def sym_infer(u: UOp, var_vals: dict[str, int]) -> Any:
    """Evaluate an integer expression with variables bound by name (exact weak-int arithmetic)."""
    from speck.uop.uop import python_alu

    vals: dict[UOp, Any] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            vals[n] = n.arg
        elif n.op is Ops.DEFINE_VAR:
            if n.arg[0] not in var_vals:
                raise UOpValueError(f"no value for variable {n.arg[0]!r}; have {sorted(var_vals)}")
            vals[n] = var_vals[n.arg[0]]
        elif n.op is Ops.BIND:
            vals[n] = n.src[1].arg
        elif n.op in GroupOp.ALU:
            vals[n] = python_alu[n.op](*[vals[s] for s in n.src])
            if n.op in (Ops.CDIV, Ops.CMOD, Ops.FDIV):
                vals[n] = exec_alu(n.op, n.dtype, [vals[s] for s in n.src])
        elif n.op is Ops.CAST:
            vals[n] = cast_value(vals[n.src[0]], n.dtype)
        else:
            raise UOpValueError(f"sym_infer can't evaluate {n.op}")
    return vals[u]


# ---------------- gates and ranges ----------------
def conjuncts(c: UOp) -> list[UOp]:
    """The clauses of a bool AND tree (c itself when it is not an AND)."""
    out, stack = [], [c]
    while stack:
        u = stack.pop()
        if u.op is Ops.AND and u.dtype is dtypes.bool:
            stack.extend(u.src)
        else:
            out.append(u)
    return out


def _is_invalid(u: UOp) -> bool:
    return u.op is Ops.CONST and isinstance(u.arg, InvalidType)


def _index_gate(idx: UOp) -> UOp | None:
    """The condition under which an INDEX is valid: its gate source, or the condition of a valid() index."""
    if idx.op is not Ops.INDEX:
        return None
    if len(idx.src) == 3:
        return idx.src[2]
    i = idx.src[1]
    if i.op is Ops.WHERE and _is_invalid(i.src[2]):
        return i.src[0]
    return None


def _index_never_valid(idx: UOp) -> bool:
    if idx.op is not Ops.INDEX:
        return False
    g = _index_gate(idx)
    return _is_invalid(idx.src[1]) or (g is not None and g.op is Ops.CONST and g.arg is False)


def _where_gated_load(c: UOp, ld: UOp, alt: UOp) -> UOp | None:
    """where(c, load(idx gated by c), alt) -> load(idx, alt): the gated load already reads alt where c is false."""
    if len(ld.src) != 1 or _index_gate(ld.src[0]) is not c:
        return None
    return UOp(Ops.LOAD, ld.dtype, (ld.src[0], alt), ld.arg)


def _dead_load(ld: UOp) -> UOp | None:
    """A load through an index that is never valid reads its alternative (or 0)."""
    if not _index_never_valid(ld.src[0]):
        return None
    return ld.src[1] if len(ld.src) >= 2 and ld.src[1].dtype is ld.dtype else UOp.const(ld.dtype, 0)


def _drop_closed_consts(x: UOp) -> UOp | None:
    """END/REDUCE over a range that became a constant (one iteration): drop it; with no ranges left the END is its
    effect and the REDUCE its value."""
    keep = tuple(r for r in x.src[1:] if r.op is not Ops.CONST)
    if len(keep) == len(x.src) - 1:
        return None
    return x.src[0] if not keep else x.replace(src=(x.src[0], *keep))


def _invalid_through_alu(a: UOp) -> UOp | None:
    """alu(where(c, x, Invalid), y) -> where(c, alu(x, y), Invalid): a valid() index keeps its gate through
    arithmetic."""
    if a.dtype.count != 1 or not dtypes.is_int(a.dtype):
        return None
    for i, s in enumerate(a.src):
        if s.op is Ops.WHERE and _is_invalid(s.src[2]) and not any(_is_invalid(o) for o in a.src):
            srcs = list(a.src)
            srcs[i] = s.src[1]
            return s.src[0].where(UOp(a.op, a.dtype, tuple(srcs), a.arg), s.src[2])
    return None


def _lt_k(c: UOp, r: UOp) -> int | None:
    """The smallest k of the conjuncts `r < k` (k a constant) of condition c, None when there is none."""
    ks = [u.src[1].arg for u in conjuncts(c) if u.op is Ops.CMPLT and u.src[0] is r and u.src[1].op is Ops.CONST]
    ks = [k for k in ks if type(k) is int]
    return min(ks) if ks else None


def _guard_of_effect(e: UOp, r: UOp) -> int | None:
    """k when every store of effect e (through GROUP and inner ENDs) is gated by r < k; the largest such k."""
    ks: list[int] = []
    stack = [e]
    while stack:
        u = stack.pop()
        if u.op in (Ops.GROUP, Ops.SINK):
            stack.extend(u.src)
        elif u.op is Ops.END:
            stack.append(u.src[0])
        elif u.op is Ops.STORE:
            g = _index_gate(u.src[0])
            k = None if g is None else _lt_k(g, r)
            if k is None:
                return None
            ks.append(k)
        else:
            return None
    return max(ks) if ks else None


def _guard_of_reduce(red: UOp, r: UOp) -> int | None:
    """k when the reduced value is the reduction's identity wherever r >= k."""
    v, op = red.src[0], red.arg
    ident = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(v.dtype)}.get(op)
    if v.dtype.count != 1 or ident is None:
        return None

    def is_ident(u: UOp) -> bool:
        return u.op is Ops.CONST and u.arg == ident and not isinstance(u.arg, InvalidType)

    if v.op is Ops.WHERE and is_ident(v.src[2]):
        return _lt_k(v.src[0], r)
    if v.op is Ops.LOAD:
        g = _index_gate(v.src[0])
        reads_ident = (len(v.src) == 1 and op is Ops.ADD) or (len(v.src) >= 2 and is_ident(v.src[1]))
        if g is not None and reads_ident:
            return _lt_k(g, r)
    return None


def shrink_guarded_ranges(sink: UOp) -> UOp | None:
    """A RANGE guarded by `r < k` at every use shrinks to the largest such k: when every STORE in the ENDs that close
    r is gated by r < k and every REDUCE over r reduces the identity where r >= k, the iterations r >= k do nothing.
    Returns the rewritten graph, or None when no range shrinks."""
    if not any(s.op in (Ops.END, Ops.STORE, Ops.GROUP) for s in sink.src):
        return None  # not a kernel: ranges are closed by ENDs (and REDUCEs inside them)
    nodes = sink.toposort()
    users: dict[UOp, list[UOp]] = {}
    for u in nodes:
        for s in u.src:
            users.setdefault(s, []).append(u)
    mapping: dict[UOp, UOp] = {}
    for r in nodes:
        if r.op is not Ops.RANGE:
            continue
        closers = [u for u in users.get(r, []) if u.op in (Ops.END, Ops.REDUCE) and r in u.src[1:]]
        if not closers or any(c.src[0] is r for c in closers):
            continue
        ks = [(_guard_of_effect(c.src[0], r) if c.op is Ops.END else _guard_of_reduce(c, r)) for c in closers]
        if any(k is None for k in ks):
            continue
        kmax = max(k for k in ks if k is not None)
        end = r.src[0]
        if not (0 <= kmax and kmax <= end.vmin and kmax < end.vmax):
            continue
        # r must not reach anything but the bodies of its closers (an unclosed use would see the shrunk range)
        closed = set(closers)
        body: set[UOp] = set()
        for c in closers:
            body.update(c.src[0].toposort())
        dep = {r}
        exposed = False
        for u in nodes:
            if u in closed or u is r:
                continue
            if any(s in dep for s in u.src):
                dep.add(u)
                if u not in body:
                    exposed = True
                    break
        if not exposed:
            mapping[r] = UOp(Ops.RANGE, r.dtype, (UOp.const(end.dtype, kmax),), r.arg, r.tag)
    return sink.substitute(mapping) if mapping else None


symbolic_gates = PatternMatcher(
    [
        # a True gate is dropped
        (
            UPat(Ops.INDEX, name="i", src=(UPat.var("b"), UPat.var("x"), UPat.const(dtypes.bool, True))),
            lambda i, b, x: i.replace(src=(b, x)),
        ),  # fmt: skip
        # a where between a gated load and its alternative is the load with that alternative
        (UPat.var("c").where(UPat(Ops.LOAD, name="ld"), UPat.var("alt")), _where_gated_load),
        (UPat(Ops.LOAD, name="ld"), _dead_load),
        # one-iteration ranges become 0 (by bounds); their END/REDUCE drop them
        (UPat((Ops.END, Ops.REDUCE), name="x"), _drop_closed_consts),
        (
            UPat(GroupOp.Binary - GroupOp.Comparison, name="a", src=(UPat(Ops.WHERE, src=(_ANY, _ANY, _INV)), _ANY)),
            _invalid_through_alu,
        ),
        (
            UPat(GroupOp.Binary - GroupOp.Comparison, name="a", src=(_ANY, UPat(Ops.WHERE, src=(_ANY, _ANY, _INV)))),
            _invalid_through_alu,
        ),  # fmt: skip
        (UPat(Ops.SINK, name="sink"), shrink_guarded_ranges),
    ],
    pure=True,
)
"""Gate and range simplification (part of `symbolic`)."""

symbolic = symbolic + symbolic_gates

register_service("symbolic_simple", symbolic_simple)
register_service("symbolic", symbolic)
