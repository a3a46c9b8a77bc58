"""Hostile round 4, the C compiler wrapper: a C compiler that misbehaves is a CompileError (or, when it can't run
at all, a ToolError) naming the compiler and saying what happened - never a raw error from deep inside. An exit 0
without an object was a bare FileNotFoundError of a temp path; an object that is no ELF (empty, text) was returned
and cached; a kill by a signal gave an empty message; a file that is no program was "Exec format error" from
subprocess; a hung compiler hung speck; a 50 MB stderr went whole into the message; a source with a lone surrogate
was a UnicodeEncodeError."""

from __future__ import annotations

import pathlib
import shutil
import struct

import pytest

from speck.codegen.compiler import ClangCompiler, CompileError
from speck.codegen.compiler import clang as clang_module
from speck.codegen.compiler.code_object import link_code_object
from speck.codegen.errors import CodeObjectLinkError, ToolError

needs_cc = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler"
)
SRC = "void k(float* a) { a[0] = 1.0f; }"

# a fake compiler's shell body -> words the CompileError must hold ($o: the -o path, the last argument)
FAKES: dict[str, tuple[str, tuple[str, ...]]] = {
    "exits_0_writing_nothing": ("exit 0", ("wrote no ELF object", "0 bytes")),
    "writes_text": ('for a in "$@"; do o=$a; done; echo notanelf > "$o"', ("wrote no ELF object", "notanelf")),
    "writes_an_empty_file": ('for a in "$@"; do o=$a; done; : > "$o"', ("wrote no ELF object",)),
    "killed_by_a_signal": ("kill -9 $$", ("killed by signal 9",)),
    "fails_with_a_message": ('echo "fatal: no space" >&2; exit 3', ("exit status 3", "fatal: no space")),
    "floods_stderr": ('head -c 3000000 /dev/zero | tr "\\0" x >&2; exit 1', ("exit status 1", "more characters")),
}


def _fake(tmp_path: pathlib.Path, body: str, name: str = "fakecc") -> str:
    p = tmp_path / name
    p.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo fakecc 1.0; exit 0; }}\n{body}\n')
    p.chmod(0o755)
    return str(p)


@pytest.mark.parametrize("case", sorted(FAKES))
def test_a_misbehaving_compiler_is_a_compile_error_saying_what_it_did(case: str, tmp_path: pathlib.Path) -> None:
    body, words = FAKES[case]
    cc = ClangCompiler(_fake(tmp_path, body))
    with pytest.raises(CompileError) as ei:
        cc.compile_uncached(SRC)
    msg = str(ei.value)
    assert cc.cc in msg and SRC in msg  # the compiler and the source
    for w in words:
        assert w in msg, f"{w!r} not in {msg[:300]!r}"
    assert len(msg) < 30000


def test_a_hung_compiler_is_stopped(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cc = ClangCompiler(_fake(tmp_path, "exec sleep 60"))
    monkeypatch.setattr(clang_module, "COMPILE_TIMEOUT", 0.5)
    with pytest.raises(CompileError, match="no result after .* the compiler was stopped"):
        cc.compile_uncached(SRC)


def test_a_file_that_is_no_program_is_a_tool_error(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "notaprogram"
    p.write_bytes(b"\x00\x01garbage")
    p.chmod(0o755)
    with pytest.raises(ToolError, match="can't be run"):
        ClangCompiler(str(p))


@needs_cc
def test_a_source_that_is_no_text_is_a_compile_error() -> None:
    with pytest.raises(CompileError, match="not valid text"):
        ClangCompiler().compile_uncached("void k(void) {} /* \udcff */")


@needs_cc
def test_the_real_compiler_still_makes_an_object() -> None:
    obj = ClangCompiler().compile_uncached(SRC)
    assert obj.startswith(b"\x7fELF")


def test_a_deep_chain_of_squares_is_searched_once_per_node() -> None:
    # x ** 2**70 is 70 squarings MUL(s, s): the gate search walked it as a tree (2**70 visits: normalize(p=2**70)
    # hung in lowering)
    from speck.codegen.lower.gated_ranges import _gate_of_term
    from speck.uop import UOp, dtypes

    v = UOp.param(0, dtypes.float32.ptr(4)).index(UOp.const(dtypes.int32, 0)).load()
    for _ in range(200):
        v = v * v
    assert _gate_of_term(v) is None


def _amd_relocatable() -> tuple[bytes, int, int]:
    """A relocatable AMDGPU object from LLVM, with its section header table's offset and entry count."""
    from speck.codegen.compiler.amdgpu import AMDGPUCompiler

    src = "define amdgpu_kernel void @k(ptr addrspace(1) %p) {\n  store i32 1, ptr addrspace(1) %p\n  ret void\n}\n"
    rel = AMDGPUCompiler().relocatable(src)
    return rel, struct.unpack_from("<Q", rel, 40)[0], struct.unpack_from("<H", rel, 60)[0]


def test_a_relocatable_with_a_name_that_is_no_utf8_is_a_link_error() -> None:
    # the AMDGPU linker decoded section and symbol names as they were: a raw UnicodeDecodeError
    rel, _, _ = _amd_relocatable()
    bad = bytearray(rel)
    at = bad.index(b".text\0") + 1
    bad[at] = 0xFF
    with pytest.raises(CodeObjectLinkError, match="not UTF-8"):
        link_code_object(bytes(bad), "k")


def test_a_relocatable_asking_for_an_absurd_alignment_is_a_link_error() -> None:
    # a section alignment of 2**60 made the linker allocate an exabyte-sized image: a raw MemoryError
    rel, shoff, shnum = _amd_relocatable()
    for i in range(1, shnum):
        bad = bytearray(rel)
        struct.pack_into("<Q", bad, shoff + i * 64 + 48, 1 << 60)  # sh_addralign
        with pytest.raises(CodeObjectLinkError, match=r"alignment 1152921504606846976; expected a power of two"):
            link_code_object(bytes(bad), "k")
    assert link_code_object(rel, "k")[:4] == b"\x7fELF"


@pytest.mark.parametrize("which", ["amdgpu", "llvm"])
def test_llvm_ir_that_is_no_text_is_a_compile_error(which: str) -> None:
    # llvmlite's UTF-8 encoding of the source raised a bare UnicodeEncodeError (ClangCompiler already said so)
    from speck.codegen.compiler.amdgpu import AMDGPUCompiler
    from speck.codegen.compiler.llvm import LLVMCompiler

    compiler = AMDGPUCompiler() if which == "amdgpu" else LLVMCompiler()
    with pytest.raises(CompileError, match="not valid text"):
        compiler.compile_uncached("define void @f() {\n  ret void\n}\n; \udcff\n")
