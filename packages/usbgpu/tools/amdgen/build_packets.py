"""The PM4 and SDMA classes: opcodes, constants and packet layouts."""

from __future__ import annotations

import re
import sys

from amdgen.build_registers import field_width
from amdgen.cparse import c_int, defines, enum_values, macro_shift
from amdgen.headers import NVD, SDMA_PKT, SOC21_ENUM
from amdgen.pysource import Call, assign, flat
from amdgen.wanted_packets import (
    EVENT_TYPES,
    PM4_DEFINES,
    PM4_OPCODES,
    PM4_PACKETS,
    PM4_VALUES,
    SDMA_OPS,
    SDMA_PACKETS,
    SDMA_SUBOPS,
)


def build_pm4(src: dict[str, bytes]) -> list[str]:
    d = defines(src[NVD].decode())
    lines = ["", "", "class PM4:", '    """PM4 type-3 opcodes and constants (nvd.h)."""', ""]
    for op in PM4_OPCODES:
        lines.append(f"    {op} = {flat(c_int(d['PACKET3_' + op]))}")
    for name in PM4_DEFINES:
        lines.append(f"    {name.removeprefix('PACKET3_')} = {flat(c_int(d[name]))}")
    for group, (macro, values) in PM4_VALUES.items():
        if not any(k.startswith(macro + "(") for k in d):
            sys.exit(f"nvd.h: no macro {macro}")
        for key, value in values.items():
            lines.append(f"    {group}_{key} = {value}")
    shifts: dict[str, tuple[int, int | None]] = {}
    for key, raw in d.items():
        name = key.split("(", 1)[0]
        try:
            shifts[name] = macro_shift(raw)
        except ValueError:
            continue
    lines += [
        "",
        "",
        "class PM4_PACKETS:",
        '    """PM4 packet layouts: {field: (dword from the header, shift, width)}."""',
        "",
    ]
    for pkt, (ndw, spec) in PM4_PACKETS.items():
        resolved: dict[str, tuple[int, int, int | None]] = {}
        for fname, (dword, where, width) in spec.items():
            if isinstance(where, int):
                resolved[fname] = (dword, where, width)
                continue
            if where not in shifts:
                sys.exit(f"nvd.h: no field macro {where}")
            shift, mask = shifts[where]
            if mask is not None and shift is not None and width is None:
                width = mask.bit_length() if mask != 1 else 1
            resolved[fname] = (dword, shift, width)
        out: dict[str, tuple[int, int, int]] = {}
        for fname, (dword, shift, width) in resolved.items():
            if width is None:  # up to the next field of the dword (or the dword's top)
                later = [s for dw, s, _ in resolved.values() if dw == dword and s > shift]
                width = (min(later) if later else 32) - shift
            out[fname] = (dword, shift, width)
        lines.append(assign(pkt, Call("Packet", [pkt, ndw, out])))
    enum = enum_values(src[SOC21_ENUM].decode(), "VGT_EVENT_TYPE")
    lines += [
        "",
        "",
        "class EVENT:",
        '    """VGT_EVENT_TYPE values (soc21_enum.h) for RELEASE_MEM / EVENT_WRITE."""',
        "",
    ]
    lines += [f"    {e} = {flat(enum[e])}" for e in EVENT_TYPES]
    return lines


def build_sdma(src: dict[str, bytes]) -> list[str]:
    d = defines(src[SDMA_PKT].decode())
    lines = ["", "", "class SDMA:", '    """SDMA 6.0 opcodes and sub-opcodes (sdma_v6_0_0_pkt_open.h)."""', ""]
    lines += [f"    OP_{op} = {flat(c_int(d['SDMA_OP_' + op]))}" for op in SDMA_OPS]
    lines += [f"    SUBOP_{op} = {flat(c_int(d['SDMA_SUBOP_' + op]))}" for op in SDMA_SUBOPS]
    all_packets = {k[len("SDMA_PKT_") : -len("_HEADER_op_offset")] for k in d if k.endswith("_HEADER_op_offset")}
    lines += ["", "", "class SDMA_PACKETS:", '    """SDMA 6.0 packet layouts: {field: (dword, shift, width)}."""', ""]
    for pkt in SDMA_PACKETS:
        fields: dict[str, tuple[int, int, int]] = {}
        for key, raw in d.items():
            m = re.fullmatch(rf"SDMA_PKT_{pkt}_([A-Z0-9_]+?)_([a-z][a-z0-9_]*)_offset", key)
            if m is None:
                continue
            longer = [
                p for p in all_packets if p != pkt and p.startswith(pkt + "_") and key.startswith(f"SDMA_PKT_{p}_")
            ]
            if longer:
                continue
            base = key[: -len("_offset")]
            shift, mask = c_int(d[base + "_shift"]), c_int(d[base + "_mask"])
            if m.group(2) in fields:
                sys.exit(f"{SDMA_PKT}: field {m.group(2)} twice in {pkt}")
            fields[m.group(2)] = (c_int(raw), shift, field_width(mask << shift, shift))
        if not fields:
            sys.exit(f"{SDMA_PKT}: no packet {pkt}")
        ndw = max(dw for dw, _, _ in fields.values()) + 1
        lines.append(assign(pkt, Call("Packet", [pkt, ndw, fields])))
    return lines
