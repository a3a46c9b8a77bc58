"""Sources equal but for the kernel's name compile once (speck.codegen.compiler.symbols, CompilePool.submit): the
renamed object must define exactly the symbols the renamed source's own object defines, with the same code, and
anything unexpected (a name used elsewhere in the source, an object laid out otherwise, a failed compile) must fall
back to compiling the source itself."""

from __future__ import annotations

import pathlib
import re
import string
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.compiler import CompileError, LLVMCompiler
from speck.codegen.compiler.pool import CompilePool
from speck.codegen.compiler.symbols import rename_symbol, symbol_names


def kernel_ir(name: str, k: float = 2.0) -> str:
    """A module as speck's LLVM renderer writes one: a `; kernel NAME` first line and one `define`."""
    return f"""; kernel {name}
define void @{name}(ptr noalias %data0, ptr noalias readonly %data1, i32 %core_start, i32 %core_end) #0 {{
entry:
  %c0 = icmp slt i32 %core_start, %core_end
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%core_start, %entry], [%n, %loop]
  %pa = getelementptr <8 x float>, ptr %data1, i32 %i
  %va = load <8 x float>, ptr %pa
  %r = fmul <8 x float> %va, <float {k}, float {k}, float {k}, float {k}, float {k}, float {k}, float {k}, float {k}>
  %q = getelementptr <8 x float>, ptr %data0, i32 %i
  store <8 x float> %r, ptr %q
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %core_end
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}
attributes #0 = {{ nounwind "frame-pointer"="none" }}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield tmp_path


@pytest.fixture(scope="module")
def compiler() -> LLVMCompiler:
    return LLVMCompiler()


names = st.text(string.ascii_letters + "_", min_size=1, max_size=3).flatmap(
    lambda head: st.text(string.ascii_letters + string.digits + "_", max_size=40).map(lambda tail: head + tail)
)


@settings(max_examples=25, deadline=None)
@given(old=names, new=names)
def test_renamed_object_defines_what_the_renamed_source_compiles_to(compiler: LLVMCompiler, old: str, new: str) -> None:
    renamed = rename_symbol(compiler.compile_uncached(kernel_ir(old)), old, new)
    own = compiler.compile_uncached(kernel_ir(new))
    assert renamed is not None
    assert symbol_names(renamed) == symbol_names(own)
    assert new in symbol_names(renamed) and (old == new or old not in symbol_names(renamed))
    # the same code and constants: only the names' strings moved
    assert _sections(renamed) == _sections(own)


def _sections(obj: bytes) -> list[bytes]:
    """Every section's contents but the string table's (compared through symbol_names), the symbol table's without
    the symbols' name offsets."""
    shoff = struct.unpack_from("<Q", obj, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)
    out = []
    for i in range(shnum):
        _, typ, _, _, off, size, _, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize)
        if typ == 3:  # SHT_STRTAB
            continue
        data = obj[off : off + size] if typ != 8 else b""  # (SHT_NOBITS has no bytes in the file)
        if typ == 2:  # SHT_SYMTAB: every field but st_name
            data = b"".join(data[k + 4 : k + 24] for k in range(0, len(data), 24))
        out.append(data)
    return out


def test_rename_refuses_what_it_does_not_understand(compiler: LLVMCompiler) -> None:
    obj = compiler.compile_uncached(kernel_ir("k_one"))
    assert rename_symbol(b"not an object", "a", "b") is None
    assert rename_symbol(obj, "no_such_symbol", "b") is None  # no symbol of that name
    assert rename_symbol(obj + b"\0" * 8, "k_one", "b") is None  # something after the section headers
    assert rename_symbol(obj, "k_one", "k_one") == obj


def test_name_free_takes_out_only_the_kernel_name(compiler: LLVMCompiler) -> None:
    a, b = compiler.name_free(kernel_ir("E_32")), compiler.name_free(kernel_ir("E_64"))
    assert a is not None and b is not None and a[0] == b[0] and (a[1], b[1]) == ("E_32", "E_64")
    assert compiler.name_free(kernel_ir("E_32", 3.0)) != a  # another body
    # the name used anywhere else (here as a local's name) is not provably only the symbol: no sharing
    assert compiler.name_free(kernel_ir("pa")) is None  # (kernel_ir's %pa)
    assert compiler.name_free(re.sub(r"^; kernel .*\n", "", kernel_ir("E_32"))) is None  # not the renderer's form


def test_pool_compiles_one_body_once(compiler: LLVMCompiler) -> None:
    pool = CompilePool(1)
    try:
        srcs = [kernel_ir(n) for n in ("E_32", "E_64", "E_32_32_5_5")] + [kernel_ir("E_10", 5.0)]
        objs = [f.result() for f in [pool.submit(compiler, s) for s in srcs]]
        st_ = pool.stats()
        assert st_["submitted"] == 4 and st_["shared"] == 2
        for name, src, obj in zip(("E_32", "E_64", "E_32_32_5_5", "E_10"), srcs, objs, strict=True):
            own = compiler.compile_uncached(src)
            assert symbol_names(obj) == symbol_names(own) and name in symbol_names(obj)
            assert _sections(obj) == _sections(own)
        # later batches share with earlier ones too
        assert symbol_names(pool.submit(compiler, kernel_ir("E_128")).result())[-1] == "E_128"
        assert pool.stats()["shared"] == 3
    finally:
        pool.shutdown()


def test_a_failed_body_is_compiled_for_each_name(compiler: LLVMCompiler) -> None:
    pool = CompilePool(1)
    try:
        bad = [kernel_ir(n).replace("%r = fmul", "%r = fmul %nope,") for n in ("bad_a", "bad_b")]
        futs = [pool.submit(compiler, s) for s in bad]
        for f, name in zip(futs, ("bad_a", "bad_b"), strict=True):
            with pytest.raises(CompileError) as e:
                f.result()
            assert f"@{name}(" in e.value.src  # each one's own error, about its own source
    finally:
        pool.shutdown()


def test_waiting_for_a_renamed_object_compiles_its_base_here(compiler: LLVMCompiler) -> None:
    pool = CompilePool(1)
    try:
        ahead = [pool.submit(compiler, kernel_ir(f"k{i}", float(i + 10))) for i in range(8)]  # (the worker starts)
        base, renamed = pool.submit(compiler, kernel_ir("E_32")), pool.submit(compiler, kernel_ir("E_64"))
        obj = pool.result(renamed)  # E_32 waits on the queue: the caller compiles it, and E_64 is it renamed
        assert symbol_names(obj) == symbol_names(compiler.compile_uncached(kernel_ir("E_64")))
        assert pool.result(base) == compiler.compile_uncached(kernel_ir("E_32"))
        st_ = pool.stats()
        assert st_["shared"] == 1 and st_["local_objects"] >= 1
        assert all(pool.result(f) for f in ahead)
    finally:
        pool.shutdown()
