"""Just enough C for the amdgpu headers: comments, #defines, integer constant expressions, field macros, enums and
the little-endian branch of byte-order #ifs."""

from __future__ import annotations

import re


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", lambda m: " " * 0 + "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def defines(text: str) -> dict[str, str]:
    """#define NAME value (object-like and function-like, continuation lines joined) -> the raw value text."""
    out: dict[str, str] = {}
    joined = strip_comments(text).replace("\\\n", " ")
    for m in re.finditer(r"^\s*#\s*define\s+(\w+(?:\([^)]*\))?)[ \t]*(.*)$", joined, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


def c_int(expr: str, known: dict[str, int] | None = None) -> int:
    """Evaluate an integer C constant expression (literals with suffixes, + - * << >> | & ~, parentheses, casts)."""
    expr = re.sub(r"\(\s*(?:uint64_t|uint32_t|u64|u32|int)\s*\)", "", expr)
    expr = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)(?:ULL|UL|LL|U|L)\b", r"\1", expr)
    if known:
        expr = re.sub(
            r"\b[A-Za-z_]\w*\b", lambda m: str(known[m.group(0)]) if m.group(0) in known else m.group(0), expr
        )
    if not expr.strip() or not re.fullmatch(r"[\s0-9a-fA-FxX+\-*/()<>|&~]*", expr):
        raise ValueError(f"not an integer constant expression: {expr!r}")
    try:
        return int(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # digits and operators only (checked above)
    except SyntaxError:
        raise ValueError(f"not an integer constant expression: {expr!r}") from None


def macro_shift(raw: str) -> tuple[int, int | None]:
    """(shift, mask or None) of a field macro: ((x) << N), (((x) & M) << N), (1 << N), (((h) >> N) & M)."""
    raw = raw.replace(" ", "")
    if m := re.fullmatch(r"\(\(\w\)<<(\w+)\)", raw):
        return c_int(m.group(1)), None
    if m := re.fullmatch(r"\(\(\(\w\)&(\w+)\)<<(\w+)\)", raw):
        return c_int(m.group(2)), c_int(m.group(1))
    if m := re.fullmatch(r"\((\w+)<<(\w+)\)", raw):
        value = c_int(m.group(1))
        return c_int(m.group(2)), value if value != 1 else 1
    if m := re.fullmatch(r"\(\(\(\w\)>>(\w+)\)&(\w+)\)", raw):
        return c_int(m.group(1)), c_int(m.group(2))
    raise ValueError(f"unrecognised field macro {raw!r}")


def enum_members(body: str, known: dict[str, int] | None = None) -> dict[str, int]:
    """The members of an enum body `A = 1, B, C = A + 4`, implicit values filled in."""
    out: dict[str, int] = {}
    value = -1
    for item in body.split(","):
        item = item.strip()
        if not item or item.startswith("#"):
            continue
        if "=" in item:
            key, expr = (s.strip() for s in item.split("=", 1))
            value = out[expr] if expr in out else c_int(expr, {**(known or {}), **out})
        else:
            key, value = item, value + 1
        out[key] = value
    return out


def enum_values(text: str, name: str) -> dict[str, int]:
    """The members of `enum name { ... }` / `typedef enum name { ... }`."""
    body = re.search(rf"enum\s+{re.escape(name)}\s*\{{(.*?)\}}", strip_comments(text), re.S)
    if body is None:
        raise ValueError(f"enum {name} not found")
    return enum_members(body.group(1))


def preprocess_endianness(text: str) -> str:
    """Keep the little-endian branch of #if/#else blocks that test the byte order; drop other directives."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch kept, some branch of the block taken)
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#if"):
            keep = "BIG" not in s.upper()
            stack.append((keep, keep))
        elif s.startswith("#elif"):
            keep = not stack[-1][1] and "BIG" not in s.upper()
            stack[-1] = (keep, stack[-1][1] or keep)
        elif s.startswith("#else"):
            stack[-1] = (not stack[-1][1], True)
        elif s.startswith("#endif"):
            stack.pop()
        elif s.startswith("#pragma pack"):
            out.append(s)
        elif not s.startswith("#") and all(kept for kept, _ in stack):
            out.append(line)
    return "\n".join(out)


def enum_values_anonymous(text: str) -> dict[str, int]:
    """Members of `typedef enum { ... } name;` (discovery.h's table ids)."""
    out: dict[str, int] = {}
    for body in re.findall(r"typedef\s+enum\s*\{(.*?)\}", strip_comments(text), re.S):
        out.update(enum_members(body, out))
    return out
