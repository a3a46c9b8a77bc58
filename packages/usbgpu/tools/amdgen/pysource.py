"""Writing Python values as source text in ruff's format (the generated module is committed formatted)."""

from __future__ import annotations

from dataclasses import dataclass


class Lit(str):
    """Source text emitted as is."""


def render(value: object, indent: int, lead: int = 0, width: int = 120) -> str:
    """`value` as Python source in ruff's format for a line indented by `indent` on which `lead` characters precede
    it: on one line if it fits, else its elements on the next line, else one element per line."""
    text = flat(value)
    if indent + lead + len(text) <= width:
        return text
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{flat(k)}: {render(v, indent + 4, len(flat(k)) + 2, width)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + ",\n" + " " * indent + "}"
    if isinstance(value, Call):
        inner = ", ".join(flat(a) for a in value.args)
        if indent + 4 + len(inner) <= width:
            return f"{value.func}(\n{pad}{inner}\n" + " " * indent + ")"
        items = [pad + render(a, indent + 4, 0, width) for a in value.args]
        return f"{value.func}(\n" + ",\n".join(items) + ",\n" + " " * indent + ")"
    if isinstance(value, list | tuple):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        inner = ", ".join(flat(a) for a in value)
        if indent + 4 + len(inner) <= width:
            return f"{open_}\n{pad}{inner}\n" + " " * indent + close
        items = [pad + render(a, indent + 4, 0, width) for a in value]
        return open_ + "\n" + ",\n".join(items) + ",\n" + " " * indent + close
    raise ValueError(f"cannot split {text[:60]}... over lines")


@dataclass
class Call:
    func: str
    args: list[object]


def flat(value: object) -> str:
    """`value` as Python source on one line (ints above 9 in hex, as the headers write them)."""
    if isinstance(value, Lit):
        return str(value)
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return f"0x{value:X}" if value > 9 else str(value)
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple):
        inner = ", ".join(flat(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(flat(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{flat(k)}: {flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Call):
        return f"{value.func}(" + ", ".join(flat(a) for a in value.args) + ")"
    raise TypeError(type(value))


def assign(name: str, value: object, indent: int = 4) -> str:
    return " " * indent + f"{name} = " + render(value, indent, len(name) + 3)
