"""The generated AMD table module: it is what the generator makes of Debian's linux-source-6.12 (which the README's
test command installs), its structure layouts agree with a C compiler's, and its value types round-trip."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.usbgpu.amd import tables
from speck.usbgpu.amd.regdefs import FieldError, Packet, Reg, Struct

ROOT = pathlib.Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "packages/usbgpu/tools/gen_amd_tables.py"
TABLES = ROOT / "packages/usbgpu/src/speck/usbgpu/amd/tables.py"
SOURCE = pathlib.Path("/usr/src/linux-source-6.12.tar.xz")
NEEDS_SOURCE = (
    f"{SOURCE} is missing: install Debian's linux-source-6.12 (apt-get install linux-source-6.12, as the README's "
    "test command does) so the generated AMD tables can be checked against the headers they come from"
)


def _generator() -> object:
    if str(GENERATOR.parent) not in sys.path:  # its pieces (the amdgen package) sit beside it, as when run as a script
        sys.path.insert(0, str(GENERATOR.parent))
    spec = importlib.util.spec_from_file_location("gen_amd_tables", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _without_version(text: str) -> str:
    """The Debian revision of the installed package may move on without touching these headers (their sha256s are
    compared): ignore that one line."""
    return re.sub(r"^Source package: .*$", "", text, count=1, flags=re.M)


@pytest.fixture(scope="module")
def headers() -> tuple[dict[str, bytes], str]:
    """The generator's members of the installed kernel source (read once: the tarball is scanned sequentially)."""
    assert SOURCE.exists(), NEEDS_SOURCE
    gen = _generator()
    return gen.read_members(SOURCE, gen.all_members())  # type: ignore[attr-defined,no-any-return]


def test_generated_module_is_what_the_kernel_headers_give(headers: tuple[dict[str, bytes], str]) -> None:
    generated = _generator().generate(SOURCE, headers)  # type: ignore[attr-defined]
    committed = TABLES.read_text()
    assert _without_version(generated) == _without_version(committed), (
        "speck/usbgpu/amd/tables.py differs from what packages/usbgpu/tools/gen_amd_tables.py generates: rerun it"
    )


def test_struct_layouts_match_the_c_compiler(tmp_path: pathlib.Path, headers: tuple[dict[str, bytes], str]) -> None:
    """offsetof/sizeof of every generated member, from gcc compiling the real headers."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc is not None, "a C compiler (gcc) is needed to check the structure layouts"
    members = {m: m.rsplit("/", 1)[1] for m in _generator().STRUCTS}  # type: ignore[attr-defined]
    for member, name in members.items():
        (tmp_path / name).write_bytes(headers[0][member])
    # amdgpu_ucode.h includes it for a type speck does not use
    (tmp_path / "amdgpu_socbb.h").write_text("struct gpu_info_soc_bounding_box_v1_0 { int unused; };")
    # amdgpu_ucode.h continues with kernel-only types after the firmware headers: keep the headers
    ucode = (tmp_path / "amdgpu_ucode.h").read_text()
    (tmp_path / "amdgpu_ucode.h").write_text(ucode[: ucode.index("union amdgpu_firmware_header")] + "\n#endif\n")
    checks: list[str] = []
    for group in vars(tables.STRUCTS).values():
        if not isinstance(group, Struct) or "__" in group.name:  # outer__member: an anonymous C type
            continue
        ctype = f"{'union' if group.union else 'struct'} {group.name}"
        checks.append(f'printf("{group.name} %zu\\n", sizeof({ctype}));')
        for member, (_, _, count, _, width) in group.members.items():
            if width or count == 0:
                continue  # bitfields and flexible arrays have no offsetof
            checks.append(f'printf("{group.name}.{member} %zu\\n", offsetof({ctype}, {member}));')
    program = "\n".join(
        [
            "#include <stdint.h>",
            "#include <stddef.h>",
            "#include <stdio.h>",
            "#include <stdbool.h>",
            "#define __packed __attribute__((packed))",
            "#define DECLARE_FLEX_ARRAY(T, N) struct { struct { } __empty_##N; T N[]; }",
            "#define LITTLEENDIAN_CPU 1",
            "typedef uint32_t u32; typedef uint8_t u8; typedef uint16_t u16; typedef uint64_t u64;",
            *[f'#include "{f}"' for f in members.values()],
            "int main(void) {",
            *checks,
            "return 0; }",
        ]
    )
    (tmp_path / "layout.c").write_text(program)
    build = subprocess.run(
        [cc, "-w", "-o", str(tmp_path / "layout"), str(tmp_path / "layout.c")], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr[-3000:]
    out = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout
    compiler = dict(line.rsplit(" ", 1) for line in out.splitlines())
    ours: dict[str, str] = {}
    for group in vars(tables.STRUCTS).values():
        if isinstance(group, Struct) and "__" not in group.name:
            ours[group.name] = str(group.size)
            for member, (offset, _, count, _, width) in group.members.items():
                if not width and count:
                    ours[f"{group.name}.{member}"] = str(offset)
    assert ours == compiler


def test_well_known_values() -> None:
    """Spot checks against values documented elsewhere (AMD's PM4 and SDMA packet formats, the PCIe BAR layout)."""
    assert (tables.PM4.SET_SH_REG, tables.PM4.DISPATCH_DIRECT, tables.PM4.RELEASE_MEM) == (0x76, 0x15, 0x49)
    assert tables.SDMA.OP_COPY == 1 and tables.SDMA.OP_POLL_REGMEM == 8
    assert tables.GC.SDMA0_QUEUE0_RB_CNTL.fields["RB_SIZE"] == (1, 5)
    assert tables.CONST.BINARY_SIGNATURE == 0x28211407
    assert tables.STRUCTS.v11_compute_mqd.size == 2048
    assert tables.STRUCTS.v11_compute_mqd.offset("cp_hqd_pq_control") % 4 == 0
    # the discovery-access registers amdgpu_discovery.c hard-codes agree with the NBIO/MP0 bases + offsets
    nbio = tables.SIM_IP_BASES["NBIO"][tables.NBIO.RCC_DEV0_EPF0_RCC_CONFIG_MEMSIZE.base_idx]
    assert nbio + tables.NBIO.RCC_DEV0_EPF0_RCC_CONFIG_MEMSIZE.offset == tables.CONST.mmRCC_CONFIG_MEMSIZE
    mp0 = tables.SIM_IP_BASES["MP0"][tables.MP.MP0_SMN_C2PMSG_33.base_idx]
    assert mp0 + tables.MP.MP0_SMN_C2PMSG_33.offset == tables.CONST.mmMP0_SMN_C2PMSG_33


_REGS = [r for cls in (tables.GC, tables.NBIO, tables.OSSSYS, tables.MP, tables.MMHUB) for r in vars(cls).values()]
_REGS = [r for r in _REGS if isinstance(r, Reg) and r.fields]


@given(st.sampled_from(_REGS), st.data())
def test_register_fields_round_trip(reg: Reg, data: st.DataObject) -> None:
    values = {name: data.draw(st.integers(0, (1 << width) - 1)) for name, (_, width) in reg.fields.items()}
    word = reg.encode(0, **values)
    assert reg.decode(word) == values
    assert all(reg.get(word, name) == value for name, value in values.items())


def test_field_errors_name_the_field() -> None:
    reg = tables.GC.SDMA0_QUEUE0_RB_CNTL
    with pytest.raises(FieldError, match="RB_SIZE is 5 bits wide"):
        reg.encode(RB_SIZE=64)
    with pytest.raises(FieldError, match="has no field 'RB_SIZ'"):
        reg.encode(RB_SIZ=1)
    with pytest.raises(FieldError, match="packet COPY_LINEAR has no field"):
        tables.SDMA_PACKETS.COPY_LINEAR.encode(bytes=3)


_PACKETS = [p for cls in (tables.PM4_PACKETS, tables.SDMA_PACKETS) for p in vars(cls).values()]
_PACKETS = [p for p in _PACKETS if isinstance(p, Packet)]


@given(st.sampled_from(_PACKETS), st.data())
def test_packet_fields_round_trip(packet: Packet, data: st.DataObject) -> None:
    """Fields of one packet never overlap: every field reads back what was written, whatever the others hold."""
    values = {name: data.draw(st.integers(0, (1 << w) - 1)) for name, (_, _, w) in packet.fields.items()}
    dwords = packet.encode(**values)
    assert packet.decode(dwords) == values


@given(st.data())
def test_struct_pack_unpack_round_trip(data: st.DataObject) -> None:
    struct = data.draw(st.sampled_from([s for s in vars(tables.STRUCTS).values() if isinstance(s, Struct)]))
    values = {}
    for name, (_, kind, count, _, width) in struct.members.items():
        if isinstance(kind, Struct) or count != 1 or struct.name == "ip_discovery_header" and name == "padding":
            continue
        bits = width or 8 * {"B": 1, "H": 2, "I": 4, "Q": 8}[kind]
        values[name] = data.draw(st.integers(0, (1 << bits) - 1))
    if struct.union:  # its members alias each other: set one
        values = dict(list(values.items())[:1])
    unpacked = struct.unpack(struct.pack(**values))
    assert {k: unpacked[k] for k in values} == values
