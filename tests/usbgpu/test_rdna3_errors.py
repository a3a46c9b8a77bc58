"""The RDNA3 emulator stops with a named error where the hardware would stop the queue (or return garbage): an
instruction it does not implement (EmulationError with the mnemonic, kernel and pc), an access outside every mapping
or outside LDS/scratch (ShaderMemoryFault with the address and the nearest region), a register read before its load
was waited for (ShaderHazardError), s_trap and runaway loops (ShaderError), and a corrupt code object
(CodeObjectError)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdna3_corpus import cases
from rdna3_llvm import asm_kernel, assemble, compile_ir
from speck.usbgpu.errors import (
    CodeObjectError,
    EmulationError,
    ShaderError,
    ShaderHang,
    ShaderHazardError,
    ShaderMemoryFault,
    ShaderTrap,
    UsbError,
)
from speck.usbgpu.sim.rdna3 import FlatMemory, run

LOAD_ARG = "  s_load_b64 s[4:5], s[0:1], 0x0\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v1, 0\n"


def run_asm(body: str, memory: FlatMemory | None = None, kernargs: bytes = b"", **kw: object) -> FlatMemory:
    mem = memory or FlatMemory()
    run(assemble(asm_kernel(body)), "k", (1, 1, 1), (32, 1, 1), kernargs, mem, **kw)  # type: ignore[arg-type]
    return mem


def test_an_unimplemented_instruction_names_itself_and_the_kernel() -> None:
    with pytest.raises(EmulationError) as e:
        run_asm("  v_cubeid_f32 v0, v1, v2, v3")
    err = e.value
    assert err.mnemonic == "v_cubeid_f32" and err.kernel == "k" and err.pc is not None
    assert "v_cubeid_f32" in str(err) and "k at pc" in str(err)
    assert isinstance(err, NotImplementedError) and isinstance(err, UsbError)


def test_only_the_vgpr_release_message_is_implemented() -> None:
    run_asm("  s_sendmsg sendmsg(MSG_DEALLOC_VGPRS)")  # what LLVM ends long kernels with
    with pytest.raises(EmulationError, match="s_sendmsg"):
        run_asm("  s_sendmsg sendmsg(MSG_INTERRUPT)")


def test_an_unsupported_encoding_names_its_words() -> None:
    with pytest.raises(EmulationError, match="MIMG"):
        run_asm("  image_load v[0:3], v0, s[0:7] dmask:0xf dim:SQ_RSRC_IMG_1D")


def test_a_read_past_the_buffer_faults_with_the_address_and_the_buffer() -> None:
    c = {x.name: x for x in cases()}["fadd_f32"]
    mem = FlatMemory()
    a = mem.alloc(np.ones(64, np.float32), "a")
    out = mem.alloc(256 * 4, "out")
    with pytest.raises(ShaderMemoryFault) as e:  # n = 256 lanes read a and b, which hold 64 floats
        run(compile_ir(c.ir), c.name, (4, 1, 1), (64, 1, 1), struct.pack("<QQQi", out, a, a, 256), mem)
    err = e.value
    assert err.address == a + 64 * 4 and err.size == 4 and err.space == "global"
    assert "'a'" not in err.region or "a [" in err.region
    assert f"{a + 256:#x}" in str(err) or f"{err.address:#x}" in str(err)


def test_lds_and_scratch_accesses_stay_inside_their_allocations() -> None:
    with pytest.raises(ShaderMemoryFault) as e:
        run_asm("  v_mov_b32 v0, 0x10000\n  ds_store_b32 v0, v0")  # no LDS allocated
    assert e.value.space == "lds" and e.value.address == 0x10000
    with pytest.raises(ShaderMemoryFault) as e:
        run_asm("  v_mov_b32 v0, 64\n  scratch_store_b32 v0, v0, off")  # no private segment either
    assert e.value.space == "scratch"


def test_using_a_load_before_waiting_for_it_is_a_hazard() -> None:
    mem = FlatMemory()
    buf = mem.alloc(np.arange(32, dtype=np.float32), "buf")
    body = LOAD_ARG + "  global_load_b32 v2, v1, s[4:5]\n  v_add_f32 v3, v2, v2"
    with pytest.raises(ShaderHazardError, match=r"v2 used while a load into it is outstanding .*vmcnt"):
        run_asm(body, mem, struct.pack("<Q", buf))
    # the same kernel with the wait runs
    run_asm(body.replace("  v_add", "  s_waitcnt vmcnt(0)\n  v_add"), mem, struct.pack("<Q", buf))


def test_loads_complete_in_order_at_the_wait() -> None:
    mem = FlatMemory()
    buf = mem.alloc(np.array([11, 22], dtype=np.uint32), "buf")
    out = mem.alloc(8, "out")
    body = (
        "  s_load_b128 s[4:7], s[0:1], 0x0\n  s_waitcnt lgkmcnt(0)\n  v_mov_b32 v1, 0\n"
        "  global_load_b32 v2, v1, s[4:5]\n  global_load_b32 v3, v1, s[4:5] offset:4\n"
        "  s_waitcnt vmcnt(1)\n  global_store_b32 v1, v2, s[6:7]\n"  # the older load is in; v3 may not be
        "  s_waitcnt vmcnt(0)\n  global_store_b32 v1, v3, s[6:7] offset:4"
    )
    run_asm(body, mem, struct.pack("<QQ", buf, out))
    assert mem.array(out, np.uint32, 2).tolist() == [11, 22]
    with pytest.raises(ShaderHazardError, match="v3"):
        run_asm(body.replace("global_store_b32 v1, v2", "global_store_b32 v1, v3"), mem, struct.pack("<QQ", buf, out))


def test_s_trap_and_runaway_kernels_stop_the_dispatch() -> None:
    with pytest.raises(ShaderTrap, match="s_trap 2") as trap:
        run_asm("  s_trap 2")
    assert trap.value.code == 2 and trap.value.kernel == "k" and trap.value.pc is not None
    with pytest.raises(ShaderHang, match="max_instructions") as hang:
        run_asm("loop:\n  s_branch loop", max_instructions=10_000)
    assert hang.value.mnemonic == "s_branch" and isinstance(hang.value, ShaderError)


CODE = compile_ir({x.name: x for x in cases()}["fadd_f32"].ir)


def test_code_object_errors_say_what_is_wrong() -> None:
    mem = FlatMemory()
    with pytest.raises(CodeObjectError, match="no symbol 'nope.kd'.*fadd_f32"):
        run(CODE, "nope", (1, 1, 1), (64, 1, 1), b"", mem)
    with pytest.raises(CodeObjectError, match="not an ELF"):
        run(b"\x7fELG" + CODE[4:], "fadd_f32", (1, 1, 1), (64, 1, 1), b"", mem)
    x86 = bytearray(CODE)
    x86[18:20] = struct.pack("<H", 62)
    with pytest.raises(CodeObjectError, match="e_machine 62"):
        run(bytes(x86), "fadd_f32", (1, 1, 1), (64, 1, 1), b"", mem)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_damaged_code_object_raises_a_named_error_never_a_crash(data: st.DataObject) -> None:
    blob = bytearray(CODE)
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            k = data.draw(st.integers(0, len(blob) - 1))
            blob[k] ^= 1 << data.draw(st.integers(0, 7))
    mem = FlatMemory()
    out = mem.alloc(64 * 4, "out")
    src = mem.alloc(64 * 4, "src")
    try:
        run(bytes(blob), "fadd_f32", (1, 1, 1), (64, 1, 1), struct.pack("<QQQi", out, src, src, 64), mem,
            max_instructions=100_000)  # fmt: skip
    except (CodeObjectError, ShaderError):
        pass  # EmulationError, faults and hazards are ShaderErrors: a flipped bit may make any of them


def test_a_scalar_destination_is_not_a_vector_register() -> None:
    """v_readfirstlane_b32 s2, v3 writes s2, not v2: an outstanding load into v2 is no hazard for it."""
    mem = FlatMemory()
    buf = mem.alloc(np.arange(32, dtype=np.uint32), "buf")
    body = LOAD_ARG + "  global_load_b32 v2, v1, s[4:5]\n  v_readfirstlane_b32 s2, v3\n  s_waitcnt vmcnt(0)"
    run_asm(body, mem, struct.pack("<Q", buf))
