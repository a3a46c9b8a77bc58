"""C structure layouts (offsets, sizes, bitfields, packing) computed from the headers' struct definitions."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from amdgen.cparse import c_int, preprocess_endianness, strip_comments

SCALARS = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q", "int32_t": "I", "u32": "I"}
SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8}


@dataclass
class CStruct:
    name: str
    size: int
    members: list[tuple[str, int, str, int, int, int]] = field(default_factory=list)  # name, off, kind, cnt, sh, w
    align: int = 1
    union: bool = False


class StructParser:
    """A parser for the plain structs of the amdgpu headers: fixed-width integers, enums (4 bytes), nested and
    anonymous structs and unions, arrays with constant (sizeof) expressions, bitfields, flexible arrays."""

    def __init__(self, text: str, consts: dict[str, int]) -> None:
        self.text = preprocess_endianness(strip_comments(text))
        self.consts = consts
        self.done: dict[str, CStruct] = {}

    def body(self, keyword: str, name: str) -> tuple[str, int]:
        m = re.search(rf"\b{keyword}\s+{re.escape(name)}\s*\{{", self.text)
        if m is None:
            raise ValueError(f"{keyword} {name} not found")
        pack = (
            1
            if self.text.rfind("#pragma pack(1)", 0, m.start()) > self.text.rfind("#pragma pack()", 0, m.start())
            else 0
        )
        return self._braced(m.end() - 1), pack

    def _braced(self, start: int) -> str:
        depth = 0
        for i in range(start, len(self.text)):
            depth += {"{": 1, "}": -1}.get(self.text[i], 0)
            if depth == 0:
                return self.text[start + 1 : i]
        raise ValueError("unbalanced braces")

    def get(self, keyword: str, name: str) -> CStruct:
        key = f"{keyword} {name}"
        if key not in self.done:
            body, pack = self.body(keyword, name)
            self.done[key] = self.layout(name, body, keyword == "union", pack)
        return self.done[key]

    def split(self, body: str) -> list[str]:
        """Top-level declarations of a struct body (nested braces kept together)."""
        decls, depth, cur = [], 0, ""
        for ch in body:
            cur += ch
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if ch == ";" and depth == 0:
                decls.append(cur.strip().rstrip(";").strip())
                cur = ""
        return [d for d in decls if d]

    def layout(self, name: str, body: str, union: bool, pack: int) -> CStruct:
        out = CStruct(name, 0, union=union)
        off = 0
        bit_unit: tuple[int, str, int] | None = None  # (offset, kind, bits used) of an open bitfield unit
        for decl in self.split(body):
            decl = re.sub(r"\b__packed\b|\b__attribute__\s*\(\(.*?\)\)", "", decl).strip()
            if m := re.fullmatch(r"DECLARE_FLEX_ARRAY\((\w+),\s*(\w+)\)", decl):
                decl = f"{m.group(1)} {m.group(2)}[]"
            if m := re.fullmatch(r"(struct|union)\s*(\w*)\s*\{(.*)\}\s*(\w*)", decl, re.S):  # nested definition
                # an anonymous type gets the name outer__member (no C name to check it against)
                anon = f"{name}__{m.group(4) or m.group(1)}"
                inner = self.layout(m.group(2) or anon, m.group(3), m.group(1) == "union", pack)
                members = [(m.group(4), inner)] if m.group(4) else None
                align = 1 if pack else inner.align
                off = -(-off // align) * align if not union else 0
                if members is None:  # anonymous: its members join ours
                    out.members += [(n, off + o, k, c, s, w) for n, o, k, c, s, w in inner.members]
                else:
                    self.done[f"struct {inner.name}"] = inner
                    out.members.append((m.group(4), off, f"@{inner.name}", 1, 0, 0))
                out.align = max(out.align, align)
                out.size = max(out.size, off + inner.size)
                off = 0 if union else off + inner.size
                bit_unit = None
                continue
            m = re.fullmatch(r"(?:(struct|union|enum)\s+)?(\w+)\s+(\w+)\s*(\[[^\]]*\])?\s*(?::\s*(\d+))?", decl)
            if m is None:
                raise ValueError(f"{name}: cannot parse member {decl!r}")
            keyword, ctype, member, dim, bits = m.groups()
            if keyword in ("struct", "union"):
                inner = self.get(keyword, ctype)
                kind, size, align = f"@{ctype}", inner.size, 1 if pack else inner.align
            elif keyword == "enum":
                kind, size, align = "I", 4, 1 if pack else 4
            elif ctype in SCALARS:
                kind = SCALARS[ctype]
                size = SIZES[kind]
                align = 1 if pack else size
            else:  # a typedef'd struct used by its bare name
                inner = self.get("struct", ctype)
                kind, size, align = f"@{ctype}", inner.size, 1 if pack else inner.align
            if dim is None:
                count = 1
            elif dim == "[]":
                count = 0
            else:
                count = self.array_len(dim[1:-1])
            if bits is not None:
                width = int(bits)
                if bit_unit is None or bit_unit[1] != kind or bit_unit[2] + width > 8 * size:
                    off = -(-off // align) * align if not union else 0
                    bit_unit = (off, kind, 0)
                    off = off + size if not union else 0
                out.members.append((member, bit_unit[0], kind, 1, bit_unit[2], width))
                bit_unit = (bit_unit[0], kind, bit_unit[2] + width)
                out.size = max(out.size, bit_unit[0] + size)
                out.align = max(out.align, align)
                continue
            bit_unit = None
            start = 0 if union else -(-off // align) * align
            out.members.append((member, start, kind, count, 0, 0))
            out.size = max(out.size, start + size * count)
            out.align = max(out.align, align)
            if not union:
                off = start + size * count
        out.size = -(-out.size // out.align) * out.align
        return out

    def array_len(self, expr: str) -> int:
        def size_of(m: re.Match[str]) -> str:
            return str(self.get(m.group(1), m.group(2)).size)

        expr = re.sub(r"sizeof\s*\(\s*(struct|union)\s+(\w+)\s*\)", size_of, expr)
        return c_int(expr, self.consts)
