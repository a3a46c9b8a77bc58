"""The compilers (speck.codegen.compiler): objects that compute the right thing, the disk cache, CACHELEVEL=0,
compile errors carrying the compiler's message and the source, and disassembly. Objects are linked into a shared
library with the system C compiler driver to run them, so these tests stay below speck.hcq."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest

from speck.codegen.compiler import ClangCompiler, CompileError, Compiler, LLVMCompiler, cache_dir
from speck.uop import Context

needs_cc = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler"
)

ADD_IR = """
define void @add(ptr noalias %o, ptr noalias %a, ptr noalias %b, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %ix = sext i32 %i to i64
  %pa = getelementptr float, ptr %a, i64 %ix
  %pb = getelementptr float, ptr %b, i64 %ix
  %va = load float, ptr %pa
  %vb = load float, ptr %pb
  %r = fadd float %va, %vb
  %q = getelementptr float, ptr %o, i64 %ix
  store float %r, ptr %q
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""

ADD_C = """
typedef float float8 __attribute__((vector_size(32)));
void add(float *restrict o, const float *restrict a, const float *restrict b, int core_start, int core_end) {
  for (int i = core_start; i < core_end; i++) o[i] = a[i] + b[i];
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield tmp_path / "compile"


def run_add(obj: bytes, n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    cc = shutil.which("gcc") or shutil.which("clang")
    assert cc is not None
    with tempfile.TemporaryDirectory() as d:
        o, so = os.path.join(d, "k.o"), os.path.join(d, "k.so")
        pathlib.Path(o).write_bytes(obj)
        subprocess.run([cc, "-shared", o, "-o", so], check=True, capture_output=True)
        lib = ctypes.CDLL(so)
        fn = lib.add
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32] * 2
        a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
        b = np.random.default_rng(2).standard_normal(n).astype(np.float32)
        out = np.zeros(n, np.float32)
        fn(out.ctypes.data, a.ctypes.data, b.ctypes.data, 0, n)
        return out, a + b


def is_relocatable_x86_64(obj: bytes) -> bool:
    return obj[:4] == b"\x7fELF" and obj[16] == 1 and obj[18] == 62


@needs_cc
@pytest.mark.c_backend
@pytest.mark.parametrize("make, src", [(lambda: LLVMCompiler(), ADD_IR), (lambda: ClangCompiler(), ADD_C)])
def test_compilers_produce_objects_that_compute(make, src: str) -> None:  # type: ignore[no-untyped-def]
    obj = make().compile(src)
    assert is_relocatable_x86_64(obj)
    out, expected = run_add(obj)
    np.testing.assert_array_equal(out, expected)


def test_llvm_compiler_targets_the_host() -> None:
    c = LLVMCompiler()
    assert c.cpu and "+" in c.features and c.flags[0] == "O2"
    assert "vaddps" in c.disassemble(c.compile(ADD_IR)) or "addps" in c.disassemble(c.compile(ADD_IR))
    assert "add:" in c.to_asm(ADD_IR)
    with pytest.raises(ValueError, match="opt level must be 0..3"):
        LLVMCompiler(opt=5)


class Counting(LLVMCompiler):
    def __init__(self, opt: int = 2) -> None:
        super().__init__(opt=opt)
        self.calls = 0

    def compile_uncached(self, src: str) -> bytes:
        self.calls += 1
        return super().compile_uncached(src)


def test_disk_cache_hits_and_misses(private_cache: pathlib.Path) -> None:
    c = Counting()
    first = c.compile(ADD_IR)
    path = private_cache / "llvm" / c.cache_key(ADD_IR)
    assert c.calls == 1 and c.disk_cache().path(c.cache_key(ADD_IR)) == path and path.read_bytes().endswith(first)
    assert c.disk_cache().get(c.cache_key(ADD_IR)) == first
    assert c.compile(ADD_IR) == first and c.calls == 1  # hit
    other = Counting()
    assert other.compile(ADD_IR) == first and other.calls == 0  # a new compiler with the same flags hits too
    c.compile(ADD_IR + "\n; changed\n")
    assert c.calls == 2  # another source misses
    o3 = Counting(opt=3)
    o3.compile(ADD_IR)
    assert o3.calls == 1 and o3.cache_key(ADD_IR) != c.cache_key(ADD_IR)  # flags are part of the key


def test_cachelevel_zero_disables_the_cache(private_cache: pathlib.Path) -> None:
    c = Counting()
    with Context(CACHELEVEL=0):
        c.compile(ADD_IR)
        c.compile(ADD_IR)
    assert c.calls == 2 and not private_cache.exists()


def test_cache_dir_follows_the_environment(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "compile"
    monkeypatch.delenv("SPECK_CACHE_DIR")
    assert cache_dir() == pathlib.Path.home() / ".cache" / "speck" / "compile"


def test_llvm_compile_error_has_the_message_and_source() -> None:
    bad = "define void @k() {\n  %x = fadd float 1.0, %nope\n  ret void\n}\n"
    with pytest.raises(CompileError) as ei:
        LLVMCompiler().compile(bad)
    msg = str(ei.value)
    assert "nope" in msg  # LLVM's own diagnostic names the undefined value
    assert "   1 | define void @k() {" in msg and "   2 |   %x = fadd float 1.0, %nope" in msg


@needs_cc
@pytest.mark.c_backend
def test_c_compile_error_has_the_message_and_source() -> None:
    bad = "void k(float *o) {\n  o[0] = undefined_thing;\n}\n" + "\n".join(f"// line {i}" for i in range(40))
    with pytest.raises(CompileError) as ei:
        ClangCompiler().compile(bad)
    msg = str(ei.value)
    assert "undefined_thing" in msg and "error" in msg
    assert "   2 |   o[0] = undefined_thing;" in msg and "more lines" in msg


@needs_cc
@pytest.mark.c_backend
def test_clang_flags_are_documented_and_used() -> None:
    c = ClangCompiler()
    doc = ClangCompiler.__doc__ or ""
    for flag in ("-ffreestanding", "-fPIC", "-O2", "-march=native", "-fno-math-errno", "-c"):
        assert flag in c.flags and flag in doc
    assert "add" in c.disassemble(c.compile(ADD_C))


def test_missing_c_compiler_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="CC='no-such-cc-speck' is not an executable found on PATH"):
        ClangCompiler(cc="no-such-cc-speck")


def test_missing_cc_setting_names_its_value() -> None:
    # (CC=/nonexistent/cc read "neither clang nor gcc is not found on PATH": a double negative naming no CC)
    with Context(CC="/nonexistent/cc"), pytest.raises(RuntimeError) as ei:
        ClangCompiler()
    msg = str(ei.value)
    assert "CC='/nonexistent/cc'" in msg and "neither" not in msg and "set CC" in msg


def test_base_compiler_requires_an_implementation() -> None:
    with (
        Context(CACHELEVEL=0),
        pytest.raises(NotImplementedError, match="Compiler does not implement compile_uncached"),
    ):
        Compiler().compile("x")
