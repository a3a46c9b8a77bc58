"""Render a UOp expression as a Python-like string (for error messages, kernel names and tests).

The string is emitted token by token from an explicit stack, so a 100k-deep expression renders in time linear in
its output (nested string formatting would copy every prefix: quadratic) and without recursion."""

from __future__ import annotations

from speck.uop.ops import Ops
from speck.uop.uop import UOp, register_service

_INFIX = {
    Ops.ADD: "+",
    Ops.SUB: "-",
    Ops.MUL: "*",
    Ops.FDIV: "/",
    Ops.CDIV: "//",
    Ops.CMOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
    Ops.XOR: "^",
    Ops.SHL: "<<",
    Ops.SHR: ">>",
}

Piece = str | UOp


def _join(parts: list[UOp], sep: str) -> list[Piece]:
    out: list[Piece] = []
    for i, p in enumerate(parts):
        if i:
            out.append(sep)
        out.append(p)
    return out


def _pieces(u: UOp) -> list[Piece]:
    """How u is written: literal text and the sources to write in their places."""
    op, s = u.op, list(u.src)
    if op is Ops.CONST:
        return [repr(u.arg)]
    if op is Ops.DEFINE_VAR:
        return [str(u.arg[0])]
    if op is Ops.BIND:
        return [s[0]]
    if op is Ops.RANGE:
        return [f"r{'_'.join(str(a) for a in u.arg[:-1])}"]
    if op is Ops.SPECIAL:
        return [str(u.arg)]
    if op is Ops.CAST:
        if u.src[0].op is Ops.CONST and u.dtype.is_weak:
            return [s[0]]
        return [f"{u.dtype.short_name}(", s[0], ")"]
    if op in _INFIX and len(s) == 2:
        c = u.src[1]
        if op is Ops.ADD and c.op is Ops.CONST and type(c.arg) in (int, float) and c.arg < 0:
            return ["(", s[0], f"-{-c.arg!r})"]
        return ["(", s[0], _INFIX[op], s[1], ")"]
    if op is Ops.MAX:
        return ["max(", s[0], ", ", s[1], ")"]
    if op is Ops.WHERE:
        return ["(", s[1], " if ", s[0], " else ", s[2], ")"]
    if op is Ops.NEG:
        return ["(-", s[0], ")"]
    if op is Ops.STACK:
        return ["(", *_join(s, ", "), ")"]
    if op is Ops.GEP:
        return [s[0], f"[{', '.join(map(str, u.arg))}]"]
    if op is Ops.INDEX:
        return [s[0], "[", *_join(s[1:], ", "), "]"]
    if op is Ops.PARAM:
        return [f"data{u.arg if isinstance(u.arg, int) else u.arg[0]}"]
    if op is Ops.LOAD:
        return [s[0]] if len(s) == 1 else ["load(", *_join(s, ", "), ")"]
    return [f"{op.name.lower()}(", *_join(s, ", "), ")"]


def render_uop(root: UOp) -> str:
    """A Python-like string of root; shared subexpressions are written out in full at each use."""
    out: list[str] = []
    stack: list[Piece] = [root]
    while stack:
        p = stack.pop()
        if isinstance(p, str):
            out.append(p)
        else:
            stack.extend(reversed(_pieces(p)))
    return "".join(out)


register_service("render_uop", render_uop)
