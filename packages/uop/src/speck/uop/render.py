"""Render a UOp expression as a Python-like string (for error messages, kernel names and tests)."""

from __future__ import annotations

from speck.uop.dtype import dtypes
from speck.uop.ops import Ops
from speck.uop.uop import UOp

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


def render_uop(root: UOp) -> str:
    """A Python-like string of root; shared subexpressions are written out in full at each use."""
    out: dict[UOp, str] = {}
    for u in root.toposort():
        s = [out[x] for x in u.src]
        if u.op is Ops.CONST:
            r = repr(u.arg)
        elif u.op is Ops.DEFINE_VAR:
            r = str(u.arg[0])
        elif u.op is Ops.BIND:
            r = s[0]
        elif u.op is Ops.RANGE:
            r = f"r{'_'.join(str(a) for a in u.arg[:-1])}"
        elif u.op is Ops.SPECIAL:
            r = str(u.arg)
        elif u.op is Ops.CAST and u.src[0].op is Ops.CONST:
            r = s[0] if u.dtype.is_weak or u.dtype == dtypes.weakint else f"{u.dtype.scalar().name}({s[0]})"
        elif u.op is Ops.CAST:
            r = f"{u.dtype.scalar().name}({s[0]})"
        elif u.op in _INFIX and len(s) == 2:
            if u.op is Ops.ADD and u.src[1].op is Ops.CONST and not isinstance(u.src[1].arg, bool) \
                    and isinstance(u.src[1].arg, (int, float)) and u.src[1].arg < 0:  # fmt: skip
                r = f"({s[0]}-{-u.src[1].arg!r})"
            else:
                r = f"({s[0]}{_INFIX[u.op]}{s[1]})"
        elif u.op is Ops.MAX:
            r = f"max({s[0]}, {s[1]})"
        elif u.op is Ops.WHERE:
            r = f"({s[1]} if {s[0]} else {s[2]})"
        elif u.op is Ops.NEG:
            r = f"(-{s[0]})"
        elif u.op is Ops.STACK:
            r = f"({', '.join(s)})"
        elif u.op is Ops.GEP:
            r = f"{s[0]}[{', '.join(map(str, u.arg))}]"
        elif u.op is Ops.INDEX:
            r = f"{s[0]}[{', '.join(s[1:])}]"
        elif u.op is Ops.PARAM:
            r = f"data{u.arg if isinstance(u.arg, int) else u.arg[0]}"
        elif u.op is Ops.LOAD:
            r = s[0] if len(s) == 1 else f"load({', '.join(s)})"
        else:
            r = f"{u.op.name.lower()}({', '.join(s)})"
        out[u] = r
    return out[root]
