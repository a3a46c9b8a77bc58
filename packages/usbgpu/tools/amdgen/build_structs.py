"""The STRUCTS class: the packed C structures of the firmware, discovery, PSP and MQD formats."""

from __future__ import annotations

import re

from amdgen.cparse import c_int, defines, enum_values, enum_values_anonymous, strip_comments
from amdgen.cstruct import CStruct, StructParser
from amdgen.pysource import Call, Lit, assign
from amdgen.wanted_formats import STRUCTS


def build_structs(src: dict[str, bytes]) -> list[str]:
    lines = [
        "",
        "",
        "class STRUCTS:",
        '    """Packed C structures (discovery.h, amdgpu_ucode.h, psp_gfx_if.h, v11_structs.h)."""',
    ]
    for member, names in STRUCTS.items():
        text = src[member].decode()
        consts: dict[str, int] = {}
        for enum in re.findall(r"enum\s+(\w*)\s*\{", strip_comments(text)):
            if enum:
                consts.update(enum_values(text, enum))
        consts.update(enum_values_anonymous(text))
        for key, raw in defines(text).items():
            try:
                consts.setdefault(key, c_int(raw))
            except ValueError:
                pass
        parser = StructParser(text, consts)
        emitted: set[str] = set()
        for name in names:
            emit_struct(parser, parser.get("struct", name), emitted, lines)
    return lines


def emit_struct(parser: StructParser, cs: CStruct, emitted: set[str], lines: list[str]) -> None:
    """Append `cs` (after the structures it nests) to `lines`, once."""
    if cs.name in emitted:
        return
    for _, _, kind, _, _, _ in cs.members:
        if kind.startswith("@"):
            inner = parser.done.get(f"struct {kind[1:]}") or parser.done[f"union {kind[1:]}"]
            emit_struct(parser, inner, emitted, lines)
    emitted.add(cs.name)
    members = {n: (o, Lit(k[1:]) if k.startswith("@") else k, c, s, w) for n, o, k, c, s, w in cs.members}
    lines.append("")
    args = [cs.name, cs.size, members] + ([Lit("union=True")] if cs.union else [])
    lines.append(assign(cs.name, Call("Struct", args)))
