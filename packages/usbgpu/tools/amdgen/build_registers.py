"""The register classes (GC, NBIO, OSSSYS, MP, MMHUB): offsets, base index, reset value and fields."""

from __future__ import annotations

import sys

from amdgen.cparse import c_int, defines
from amdgen.headers import REG_HEADERS
from amdgen.pysource import Call, assign
from amdgen.wanted_registers import REGISTERS


def field_width(mask: int, shift: int) -> int:
    width = (mask >> shift).bit_length()
    if mask != ((1 << width) - 1) << shift:
        raise ValueError(f"mask {mask:#x} is not contiguous from bit {shift}")
    return width


def build_registers(src: dict[str, bytes]) -> list[str]:
    lines: list[str] = []
    for ip, (off_h, mask_h, default_h) in REG_HEADERS.items():
        offs = defines(src[off_h].decode())
        masks = defines(src[mask_h].decode())
        defaults = defines(src[default_h].decode()) if default_h else {}
        lines += [
            "",
            "",
            f"class {ip}:",
            f'    """{ip} registers ({off_h.rsplit("/", 1)[1]}, '
            f'{mask_h.rsplit("/", 1)[1]}{", " + default_h.rsplit("/", 1)[1] if default_h else ""})."""',
            "",
        ]
        for name in REGISTERS[ip]:
            if f"reg{name}" not in offs:
                sys.exit(f"{off_h}: no register {name}")
            offset, base_idx = c_int(offs[f"reg{name}"]), c_int(offs[f"reg{name}_BASE_IDX"])
            default = c_int(defaults[f"reg{name}_DEFAULT"]) if f"reg{name}_DEFAULT" in defaults else 0
            fields: dict[str, tuple[int, int]] = {}
            prefix = f"{name}__"
            for key, raw in masks.items():
                if key.startswith(prefix) and key.endswith("__SHIFT"):
                    fname = key[len(prefix) : -len("__SHIFT")]
                    shift, mask = c_int(raw), c_int(masks[f"{prefix}{fname}_MASK"])
                    fields[fname] = (shift, field_width(mask, shift))
            fields = dict(sorted(fields.items(), key=lambda kv: kv[1][0]))
            block = name.split("_", 1)[0] if ip == "MP" else ip  # MP0_* and MP1_* registers use their own bases
            lines.append(assign(name, Call("Reg", [block, name, offset, base_idx, default, fields])))
    return lines
