"""Reference evaluator for integer UOp expressions used by the property tests: plain Python ints, C-style truncating
division and modulo written out here (independent of speck.uop's own folding code), optional fixed-width wrap."""

from __future__ import annotations

from typing import Any

from speck.uop import Ops, UOp, dtypes


class DivByZero(Exception):
    """The expression divides by zero at this assignment (undefined; the sample is discarded)."""


def c_div(a: int, b: int) -> int:
    if b == 0:
        raise DivByZero
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def c_mod(a: int, b: int) -> int:
    return a - c_div(a, b) * b


def wrap(v: Any, dt: Any) -> Any:
    if dt == dtypes.bool or isinstance(v, bool):
        return v
    if dt == dtypes.weakint:
        return v
    bits = 8 * dt.itemsize
    v &= (1 << bits) - 1
    if not dtypes.is_unsigned(dt) and v >> (bits - 1):
        v -= 1 << bits
    return v


def evaluate(root: UOp, env: dict[str, int]) -> Any:
    """Value of root with DEFINE_VARs taken from env by name."""
    vals: dict[UOp, Any] = {}
    for u in root.toposort():
        s = [vals[x] for x in u.src]
        op = u.op
        if op is Ops.CONST:
            v = u.arg
        elif op is Ops.DEFINE_VAR:
            v = env[u.arg[0]]
        elif op is Ops.ADD:
            v = s[0] + s[1]
        elif op is Ops.SUB:
            v = s[0] - s[1]
        elif op is Ops.MUL:
            v = s[0] * s[1]
        elif op is Ops.NEG:
            v = -s[0]
        elif op is Ops.CDIV:
            v = c_div(s[0], s[1])
        elif op is Ops.CMOD:
            v = c_mod(s[0], s[1])
        elif op is Ops.MAX:
            v = max(s[0], s[1])
        elif op is Ops.CMPLT:
            v = s[0] < s[1]
        elif op is Ops.CMPNE:
            v = s[0] != s[1]
        elif op is Ops.CMPEQ:
            v = s[0] == s[1]
        elif op is Ops.WHERE:
            v = s[1] if s[0] else s[2]
        elif op is Ops.AND:
            v = s[0] & s[1]
        elif op is Ops.OR:
            v = s[0] | s[1]
        elif op is Ops.XOR:
            v = s[0] ^ s[1]
        elif op is Ops.SHL:
            v = s[0] << s[1]
        elif op is Ops.SHR:
            v = s[0] >> s[1]
        elif op is Ops.CAST:
            v = bool(s[0]) if u.dtype == dtypes.bool else int(s[0])
        else:
            raise AssertionError(f"evaluate: unsupported {op}")
        vals[u] = wrap(v, u.dtype)
    return vals[root]
