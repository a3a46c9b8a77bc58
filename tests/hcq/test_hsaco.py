"""speck.hcq.hsaco: HSA code objects read back, checked against LLVM 16's tools on the AMD backend's corpus.

- the kernel descriptor's decoded fields say what llvm-objdump's descriptor disassembly (`.amdhsa_*` directives)
  says; the metadata says what llvm-readelf --notes prints; the kernel's code is the bytes llvm-objdump decodes at
  its entry, and ld.lld's shared object of the same relocatable object parses to the same kernels;
- the msgpack decoder agrees with the msgpack package;
- a truncated, bit-flipped or foreign object raises CodeObjectError (a named error), never anything else."""

from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from functools import cache
from typing import Any

import msgpack
import pytest
from codegen_amd import CORPUS, CORPUS_IDS, amd_compiler, corpus_spec, damaged, elementwise, tool
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.program import to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.hcq.errors import CodeObjectError, ElfLinkError
from speck.hcq.hsaco import KernelDescriptor, parse_code_object, unpack_msgpack
from speck.uop import dtypes

IDS = CORPUS_IDS


_compiler, _spec = amd_compiler, corpus_spec


def _lib(i: int) -> bytes:
    lib = _spec(i).lib
    assert lib is not None
    return lib


def _tool(args: list[str], data: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(data)
        f.flush()
        proc = subprocess.run([*args, f.name], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _objdump_descriptor(data: bytes, name: str) -> dict[str, int]:
    """The `.amdhsa_*` directives llvm-objdump disassembles the descriptor `<name>.kd` into."""
    out = _tool([tool("objdump"), "--mcpu=gfx1100", "-D", "-j", ".rodata"], data)
    block = out.split(f"<{name}.kd>:", 1)[1].split(".end_amdhsa_kernel", 1)[0]
    return {k: int(v, 0) for k, v in re.findall(r"\.amdhsa_(\w+) (\d\S*)", block)}


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=IDS)
def test_descriptor_fields_are_what_llvm_objdump_reads(i: int) -> None:
    spec, lib = _spec(i), _lib(i)
    co = parse_code_object(lib, spec.name)
    k = co.kernel(spec.name)
    d = k.descriptor
    od = _objdump_descriptor(lib, spec.name)
    decoded = {
        "group_segment_fixed_size": d.group_segment_fixed_size,
        "private_segment_fixed_size": d.private_segment_fixed_size,
        "kernarg_size": d.kernarg_size,
        "next_free_vgpr": d.vgpr_count,
        "float_round_mode_32": d.float_round_mode_32,
        "float_round_mode_16_64": d.float_round_mode_16_64,
        "float_denorm_mode_32": d.float_denorm_mode_32,
        "float_denorm_mode_16_64": d.float_denorm_mode_16_64,
        "dx10_clamp": int(d.dx10_clamp),
        "ieee_mode": int(d.ieee_mode),
        "fp16_overflow": int(d.fp16_overflow),
        "workgroup_processor_mode": int(d.workgroup_processor_mode),
        "memory_ordered": int(d.memory_ordered),
        "forward_progress": int(d.forward_progress),
        "enable_private_segment": int(d.enable_private_segment),
        "system_sgpr_workgroup_id_x": int(d.workgroup_id_enabled[0]),
        "system_sgpr_workgroup_id_y": int(d.workgroup_id_enabled[1]),
        "system_sgpr_workgroup_id_z": int(d.workgroup_id_enabled[2]),
        "system_sgpr_workgroup_info": int(d.enable_workgroup_info),
        "system_vgpr_workitem_id": d.workitem_id_dims - 1,
        "wavefront_size32": int(d.wavefront_size32),
        **{f"user_sgpr_{nm}": int(nm in dict(d.user_sgprs())) for nm in
           ("dispatch_ptr", "queue_ptr", "kernarg_segment_ptr", "dispatch_id", "private_segment_size")},
    }  # fmt: skip
    assert {key: od[key] for key in decoded} == decoded
    # what the renderer asked for: wave32, only the kernarg pointer, the ids the kernel reads
    assert d.wavefront_size32 and d.user_sgprs() == [("kernarg_segment_ptr", 2)]
    local = spec.local_size or (1, 1, 1)
    assert d.workitem_id_dims == max((n for n, s in zip((1, 2, 3), local) if s > 1), default=1)
    assert d.kernarg_size == 8 * len(spec.buffers) + 4 * len(spec.vars)


@pytest.mark.parametrize("i", range(0, len(CORPUS), 3), ids=IDS[::3])
def test_metadata_is_what_llvm_readelf_prints(i: int) -> None:
    spec, lib = _spec(i), _lib(i)
    k = parse_code_object(lib).kernel(spec.name)
    text = _tool([tool("readelf"), "--notes"], lib)
    fields = {".kernarg_segment_size": k.kernarg_segment_size, ".kernarg_segment_align": k.kernarg_segment_align,
              ".wavefront_size": k.wavefront_size, ".sgpr_count": k.sgpr_count, ".vgpr_count": k.vgpr_count,
              ".group_segment_fixed_size": k.group_segment_fixed_size,
              ".private_segment_fixed_size": k.private_segment_fixed_size,
              ".max_flat_workgroup_size": k.max_flat_workgroup_size}  # fmt: skip
    for key, v in fields.items():
        assert re.search(rf"^\s*{re.escape(key)}:\s+{v}$", text, re.M), (key, v)
    shown = re.findall(r"\.name:\s+(\S+)\n\s+\.offset:\s+(\d+)\n\s+\.size:\s+(\d+)", text)
    assert [(a.name, a.offset, a.size) for a in k.args] == [(n, int(o), int(s)) for n, o, s in shown]
    assert k.reqd_workgroup_size == tuple(spec.local_size or (1, 1, 1))
    assert k.vgpr_count <= k.descriptor.vgpr_count  # the descriptor allocates whole granules


@pytest.mark.parametrize("i", range(0, len(CORPUS), 5), ids=IDS[::5])
def test_code_is_what_llvm_objdump_decodes_and_lld_agrees(i: int) -> None:
    spec, lib = _spec(i), _lib(i)
    co = parse_code_object(lib)
    k = co.kernel(spec.name)
    assert (
        co.arch == "gfx1100" and co.version == 5 and co.image[k.code_address : k.code_address + len(k.code)] == k.code
    )
    listing = _tool([tool("objdump"), "--mcpu=gfx1100", "-d"], lib)
    words = re.findall(r"// ([0-9A-F]{12}): ((?:[0-9A-F]{8} ?)+)", listing)
    assert int(words[0][0], 16) == k.code_address
    decoded = b"".join(struct.pack("<I", int(w, 16)) for _, ws in words for w in ws.split())
    assert k.code.startswith(decoded[: len(k.code)]) and len(decoded) >= len(k.code) - 4 * 64  # tail: s_code_end
    rel = _compiler().relocatable(spec.src)
    with tempfile.NamedTemporaryFile(suffix=".o") as r, tempfile.NamedTemporaryFile(suffix=".so") as so:
        r.write(rel)
        r.flush()
        subprocess.run([tool("lld"), "-shared", r.name, "-o", so.name], check=True)
        with open(so.name, "rb") as f:
            theirs = parse_code_object(f.read()).kernel(spec.name)
    assert (theirs.descriptor, theirs.code, theirs.code_address, theirs.args) == (k.descriptor, k.code,
                                                                                 k.code_address, k.args)  # fmt: skip


def test_user_sgprs_follow_the_hardware_order() -> None:
    props = 0b1011011  # private segment buffer, dispatch ptr, kernarg ptr, dispatch id, private segment size
    kd = KernelDescriptor.from_bytes(struct.pack("<IIIIq20sIIIHH4s", 0, 0, 0, 0, 0, bytes(20), 0, 0, 0,
                                                 props | 1 << 10, 0, bytes(4)))  # fmt: skip
    assert kd.user_sgprs() == [("private_segment_buffer", 4), ("dispatch_ptr", 2), ("kernarg_segment_ptr", 2),
                               ("dispatch_id", 2), ("private_segment_size", 1)]  # fmt: skip
    assert kd.wavefront_size32 and kd.vgpr_count == 8
    with pytest.raises(CodeObjectError, match="expected 64 bytes"):
        KernelDescriptor.from_bytes(bytes(63))


@cache
def _small() -> bytes:
    lib = to_program(elementwise(dtypes.float32, 64), AMDGPURenderer(), _compiler()).lib
    assert lib is not None
    return lib


def test_named_errors_for_foreign_and_damaged_objects() -> None:
    lib = _small()
    with pytest.raises(CodeObjectError, match="not an ELF object"):
        parse_code_object(b"\x7fELX" + lib[4:], "k")
    rel = _compiler().relocatable(to_program(elementwise(dtypes.float32, 64), AMDGPURenderer()).src)
    with pytest.raises(CodeObjectError, match=r"expected an HSA code object .*link AMDGPU relocatable objects first"):
        parse_code_object(rel, "k")
    x86 = bytearray(lib)
    x86[18:20] = struct.pack("<H", 62)
    with pytest.raises(CodeObjectError, match="expected an AMDGPU object"):
        parse_code_object(bytes(x86), "k")
    with pytest.raises(CodeObjectError, match="truncated"):
        parse_code_object(lib[:60], "k")
    mach = bytearray(lib)
    mach[48] = 0x2F  # gfx90a
    with pytest.raises(CodeObjectError, match="not an RDNA3 target"):
        parse_code_object(bytes(mach), "k")
    with pytest.raises(CodeObjectError, match="no kernel 'nope'"):
        parse_code_object(lib, "k").kernel("nope")
    assert issubclass(CodeObjectError, ElfLinkError) and issubclass(CodeObjectError, ValueError)


def test_metadata_that_disagrees_with_the_descriptor_is_refused() -> None:
    lib = bytearray(_small())
    co = parse_code_object(bytes(lib))
    (k,) = co.kernels.values()
    struct.pack_into("<I", lib, lib.index(bytes(co.image[k.descriptor_address : k.descriptor_address + 64])) + 8, 4)
    with pytest.raises(CodeObjectError, match="kernarg bytes"):
        parse_code_object(bytes(lib), "k")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_damaged_code_objects_raise_code_object_error(data: st.DataObject) -> None:
    try:
        parse_code_object(damaged(data, _small()), "dmg")
    except CodeObjectError as e:
        assert "'dmg'" in str(e)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=40)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(_values)
def test_msgpack_decoder_agrees_with_msgpack(v: Any) -> None:
    assert unpack_msgpack(msgpack.packb(v, use_bin_type=True)) == v


@settings(max_examples=200, deadline=None)
@given(_values, st.data())
def test_msgpack_decoder_fails_cleanly(v: Any, data: st.DataObject) -> None:
    raw = bytearray(msgpack.packb(v, use_bin_type=True))
    raw = raw[: data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=3))
    try:
        got = unpack_msgpack(bytes(raw))
    except CodeObjectError:
        return
    try:  # whatever decodes must be what msgpack decodes
        assert got == msgpack.unpackb(bytes(raw), raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, UnicodeDecodeError):
        pytest.fail(f"decoded {got!r} from bytes msgpack refuses")
