"""The symbolic rule set: exact constant folding, algebraic identities, constant combining, comparisons decided by
bounds, and division/modulo folding from bounds. `UOp.simplify()` applies `symbolic` to a fixed point.

Integer division and modulo are CDIV/CMOD: they truncate toward zero like C (-7 // 2 == -3, -7 % 2 == -1), so the
floor-style identities below are only applied where the dividend is known to be non-negative."""

from __future__ import annotations

from typing import Any

from speck.uop.dtype import ALL_SCALARS, DType, Invalid, InvalidType, bitcast, cast_value, dtypes
from speck.uop.ops import GroupOp, Ops
from speck.uop.upat import PatternMatcher, UPat
from speck.uop.uop import UOp, exec_alu

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
    if x.op is Ops.CONST or x.dtype.count != 1 or x.op in (Ops.DEFINE_VAR, Ops.BIND):
        return None
    if x.op is Ops.RANGE or x.op is Ops.SPECIAL:
        return UOp.const(x.dtype, 0) if x.vmax == 0 else None
    lo, hi = x.vmin, x.vmax
    if isinstance(lo, (int, bool)) and lo == hi and not isinstance(lo, float):
        return UOp.const(x.dtype, lo)
    return None


# ---------------- identities ----------------
def _cast_cast(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """cast(cast(x, a), b) -> cast(x, b) when the middle cast loses nothing."""
    from speck.uop.dtype import can_lossless_cast

    if x.dtype.count != 1:
        return None
    if can_lossless_cast(x.dtype, c1.dtype):
        return x.cast(c2.dtype) if x.dtype != c2.dtype else x
    return None


def _neg_cast(x: UOp, c: UOp) -> UOp | None:
    """float->int casts truncate toward zero, so cast(-x) == -cast(x): lets a.cast(int) + (-a).cast(int) fold to 0."""
    if dtypes.is_float(x.dtype) and dtypes.is_int(c.dtype) and not dtypes.is_unsigned(c.dtype):
        return x.cast(c.dtype) * -1
    return None


def _mul_combine(x: UOp, c1: UOp, c2: UOp) -> UOp:
    return x * exec_alu(Ops.MUL, c1.dtype, [c1.arg, c2.arg])


def _add_combine(x: UOp, c1: UOp, c2: UOp) -> UOp:
    return x + exec_alu(Ops.ADD, c1.dtype, [c1.arg, c2.arg])


def _like_terms(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    return x * exec_alu(Ops.ADD, c1.dtype, [c1.arg, c2.arg])


# ---------------- division and modulo ----------------
def _split_terms(x: UOp) -> list[tuple[UOp | None, int]]:
    """x as a list of (term, coefficient) for an ADD chain of ints; a None term is the constant part."""
    out: list[tuple[UOp | None, int]] = []
    stack = [x]
    while stack:
        u = stack.pop()
        if u.op is Ops.ADD:
            stack.extend(u.src)
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
    when the rest stays inside [0, c) it is the remainder. Covers ((x*4)+2) % 4 -> 2 and (n*6)//3 -> n*2."""
    cv = c.arg
    if not isinstance(cv, int) or cv <= 0 or x.vmin < 0 or not dtypes.is_int(x.dtype):
        return None
    if x.vmax < cv:
        return x if d.op is Ops.CMOD else UOp.const(d.dtype, 0)
    terms = _split_terms(x)
    quo: list[tuple[UOp | None, int]] = []
    rem: list[tuple[UOp | None, int]] = []
    for t, k in terms:
        if k % cv == 0:
            quo.append((t, k // cv))
        elif t is None:
            quo.append((None, k // cv))
            rem.append((None, k % cv))
        else:
            rem.append((t, k))
    if not quo:
        return None
    rem_u = _rebuild(x.dtype, rem)
    if not (rem_u.vmin >= 0 and rem_u.vmax < cv):
        # the remainder part may still carry; only fold when every quotient term is exact and rem is nonneg
        if d.op is Ops.CMOD and all(t is not None for t, _ in quo) and rem_u.vmin >= 0:
            return rem_u % cv if rem_u is not x else None
        return None
    if d.op is Ops.CMOD:
        return rem_u
    return _rebuild(x.dtype, quo)


def fold_div_div(x: UOp, c1: UOp, c2: UOp) -> UOp | None:
    """(x // a) // b -> x // (a*b) for positive a, b (true for truncating division of any sign)."""
    if isinstance(c1.arg, int) and isinstance(c2.arg, int) and c1.arg > 0 and c2.arg > 0:
        return x // (c1.arg * c2.arg)
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
    """Any ALU op on Invalid is Invalid (a WHERE only when the Invalid can be selected)."""
    if a.op is Ops.WHERE:
        return None
    if any(s.op is Ops.CONST and isinstance(s.arg, InvalidType) for s in a.src):
        return UOp.const(a.dtype if a.op not in GroupOp.Comparison else a.dtype, Invalid)
    return None


def _nan_safe_mul_zero(x: UOp, c: UOp) -> UOp | None:
    if dtypes.is_int(x.dtype) or x.dtype.scalar() == dtypes.bool:
        return UOp.const(x.dtype, 0)
    return None


def _sub_self(x: UOp) -> UOp | None:
    return UOp.const(x.dtype, 0) if dtypes.is_int(x.dtype) else None


def _const_right(a: UOp) -> UOp | None:
    """Constants go on the right of commutative ADD/MUL, so one canonical form remains."""
    x, y = a.src
    if x.op is Ops.CONST and y.op is not Ops.CONST:
        return UOp(a.op, a.dtype, (y, x))
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
        (UPat(GroupOp.ALU, name="a"), _invalid_alu),
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
        (UPat(Ops.CAST, name="c", src=(UPat.var("x") * -1,)), _neg_cast),
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), lambda c, x: x if c.dtype == x.dtype else None),
        # constants to the right, then combined
        (UPat((Ops.ADD, Ops.MUL), name="a"), _const_right),
        ((UPat.var("x") + UPat.cvar("c1")) + UPat.cvar("c2"), _add_combine),
        ((UPat.var("x") * UPat.cvar("c1")) * UPat.cvar("c2"), _mul_combine),
        ((UPat.var("x", INTS) + UPat.cvar("c")) + UPat.var("y"), _move_const_up),
        # like terms
        (UPat.var("x", INTS) + UPat.var("x"), lambda x: x * 2),
        (UPat.var("x", INTS) * UPat.cvar("c1") + UPat.var("x") * UPat.cvar("c2"), _like_terms),
        (UPat.var("x", INTS) * UPat.cvar("c1") + UPat.var("x"), lambda x, c1: x * (c1.arg + 1)),
        ((UPat.var("x", INTS) * UPat.cvar("c1")) * -1, lambda x, c1: x * -c1.arg),
    ]
)

symbolic = symbolic_simple + PatternMatcher(
    [
        # bounds decide ints and comparisons
        (UPat(GroupOp.ALU | {Ops.CAST, Ops.RANGE, Ops.SPECIAL}, dtype=INTS_BOOL, name="x"), _const_from_bounds),
        (UPat.var("x").maximum(UPat.var("y")), _max_bounds),
        # division and modulo
        (UPat((Ops.CDIV, Ops.CMOD), name="d", src=(UPat.var("x"), UPat.cvar("c"))), fold_divmod),
        ((UPat.var("x", INTS) // UPat.cvar("c1")) // UPat.cvar("c2"), fold_div_div),
        ((UPat.var("x", INTS) % UPat.cvar("c1")) % UPat.cvar("c2"), fold_mod_mod),
        ((UPat.var("x", INTS) * UPat.cvar("c")) // UPat.cvar("c"), lambda x, c: x if c.arg != 0 else None),
        (
            (UPat.var("x", INTS) * UPat.cvar("c")) % UPat.cvar("c"),
            lambda x, c: UOp.const(x.dtype, 0) if c.arg != 0 else None,
        ),  # fmt: skip
        # comparisons
        ((UPat.var("x", INTS) * UPat.cvar("c")) < UPat.var("y"), _lt_const_fold),
        ((UPat.var("x", INTS) + UPat.cvar("c1")) < UPat.cvar("c2"), _lt_add_const),
    ]
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
                raise RuntimeError(f"no value for variable {n.arg[0]!r}; have {sorted(var_vals)}")
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
            raise RuntimeError(f"sym_infer can't evaluate {n.op}")
    return vals[u]
