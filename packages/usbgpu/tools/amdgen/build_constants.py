"""The CONST class and the module-level tables: #defines, enum members, ring-entry layouts, hub client ids, IP
hardware ids and the simulated card's IP base segments."""

from __future__ import annotations

import re
import sys

from amdgen.cparse import c_int, defines, enum_values, enum_values_anonymous, strip_comments
from amdgen.headers import DISCOVERY, DISCOVERY_DRV_C, GFXHUB_C, HW_IP, IP_OFFSET
from amdgen.pysource import Call, assign, flat
from amdgen.wanted_formats import CP_RING_ID, DEFINES, ENUMS, IH_ENTRY, IP_BASE_BLOCKS


def build_constants(src: dict[str, bytes]) -> list[str]:
    lines = [
        "",
        "",
        "class CONST:",
        '    """Integer constants (#define and enum members) named as in the headers."""',
        "",
    ]
    for member, names in DEFINES.items():
        d = defines(src[member].decode())
        for name in names:
            if name not in d:
                sys.exit(f"{member}: no #define {name}")
            lines.append(f"    {name} = {flat(c_int(d[name]))}")
    for member, enums in ENUMS.items():
        text = src[member].decode()
        for enum, wanted in enums:
            values = enum_values(text, enum)
            for name in wanted:
                if name not in values:
                    sys.exit(f"{member}: enum {enum} has no {name}")
                lines.append(f"    {name} = {flat(values[name])}")
    table = enum_values_anonymous(src[DISCOVERY].decode())
    lines += [f"    TABLE_{k} = {v}" for k, v in table.items() if k in ("IP_DISCOVERY", "GC", "TOTAL_TABLES")]
    lines += ["", "", assign("IH_ENTRY", Call("Packet", ["IH_ENTRY", 8, IH_ENTRY]), 0)]
    lines.append(assign("CP_RING_ID", Call("Packet", ["CP_RING_ID", 1, CP_RING_ID]), 0))
    body = re.search(r"gfxhub_client_ids\[\]\s*=\s*\{(.*?)\}", strip_comments(src[GFXHUB_C].decode()), re.S)
    if body is None:
        sys.exit(f"{GFXHUB_C}: no gfxhub_client_ids")
    lines += ["# GCVM_L2_PROTECTION_FAULT_STATUS.CID -> the GFX hub client (gfxhub_v3_0.c gfxhub_client_ids)."]
    lines.append(assign("GFXHUB_CLIENT_IDS", re.findall(r'"([^"]*)"', body.group(1)), 0))
    hwids = {k: v for k, v in defines(src[HW_IP].decode()).items() if k.endswith("_HWID")}
    hwip = dict(re.findall(r"\[(\w+)_HWIP\]\s*=\s*(\w+_HWID)", strip_comments(src[DISCOVERY_DRV_C].decode())))
    lines += ["# IP block -> hardware id in the discovery table (amdgpu_discovery.c hw_id_map, soc15_hw_ip.h)."]
    lines.append(assign("IP_HWID", {ip: c_int(hwids[hwip[ip]]) for ip in IP_BASE_BLOCKS + ["SDMA0"]}, 0))
    d = defines(src[IP_OFFSET].decode())
    bases = {ip: [c_int(d[f"{ip}_BASE__INST0_SEG{i}"]) for i in range(5)] for ip in IP_BASE_BLOCKS}
    lines += [
        "# Base segments the simulated card reports through IP discovery: the Navi 21 values of",
        f"# {IP_OFFSET}",
        "# (a real card reports its own, which the driver reads from its discovery table).",
    ]
    lines.append(assign("SIM_IP_BASES", {ip: tuple(v) for ip, v in bases.items()}, 0))
    return lines
