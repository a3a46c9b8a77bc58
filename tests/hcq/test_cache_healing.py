"""A compile cache entry damaged in any way never breaks a program: the next compile + load on Device["CPU"] returns
the right values, warns (CacheWarning), and leaves a healthy entry behind. Damage the cache's checksum sees (empty,
truncated, random bytes, another kernel's entry file, a bit flip, an old-format bare object) is a miss; an intact
entry holding the wrong object fails to link and `load_program` compiles once more. An object that fails freshly
compiled too is a real error and is raised as such."""

from __future__ import annotations

import os
import pathlib
import types
import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from speck.codegen import to_program
from speck.codegen.cache import CacheWarning, DiskCache
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.hcq import Buffer, Device, ElfLinkError
from speck.uop import AxisType, UOp, dtypes

N_A, N_B = 1000, 500


def kernel_a() -> UOp:  # out = a * 2.5 + b
    r = UOp.range(N_A, 0, AxisType.GLOBAL)
    o, a, b = (UOp.param(i, dtypes.float32.ptr(N_A)) for i in range(3))
    val = a.index(r).load() * UOp.const(dtypes.float32, 2.5) + b.index(r).load()
    return UOp.sink(o.index(r).store(val).end(r), arg=KernelInfo(name="heal_a"))


def kernel_b() -> UOp:  # out = a - b * 3, another name and size
    r = UOp.range(N_B, 0, AxisType.GLOBAL)
    o, a, b = (UOp.param(i, dtypes.float32.ptr(N_B)) for i in range(3))
    val = a.index(r).load() - b.index(r).load() * UOp.const(dtypes.float32, 3.0)
    return UOp.sink(o.index(r).store(val).end(r), arg=KernelInfo(name="heal_b"))


RNG = np.random.default_rng(3)
X, Y = RNG.standard_normal(N_A).astype(np.float32), RNG.standard_normal(N_A).astype(np.float32)


def compile_and_run(ast: UOp, n: int) -> np.ndarray:
    """What a realize does: lower + compile through the device's (cached) compiler, load_program, run."""
    dev = Device["CPU"]
    spec = to_program(ast, LLVMRenderer())
    spec.lib = dev.backend.compiler_for(spec).compile(spec.src)  # (the compiler a realize picks for this spec)
    prog = dev.load_program(spec)
    O = Buffer("CPU", n, np.float32)
    prog(O, Buffer("CPU", n, np.float32).copyin(X[:n]), Buffer("CPU", n, np.float32).copyin(Y[:n]), wait=True)
    return O.numpy().copy()


def expected_a() -> np.ndarray:
    return X * np.float32(2.5) + Y


@pytest.fixture
def cold_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield tmp_path


def entry_of(ast: UOp) -> tuple[DiskCache, str, str]:
    spec = to_program(ast, LLVMRenderer())
    compiler = Device["CPU"].backend.compiler_for(spec)
    return compiler.disk_cache(), compiler.cache_key(spec.src), spec.src


def damage(how: str, store: DiskCache, key: str) -> None:
    path = store.path(key)
    blob = path.read_bytes()
    _, key_b, src_b = entry_of(kernel_b())
    if how == "empty file":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    elif how == "random bytes":
        path.write_bytes(os.urandom(len(blob)))
    elif how == "bit flip in the object":
        path.write_bytes(blob[:-40] + bytes([blob[-40] ^ 0x10]) + blob[-39:])
    elif how == "another kernel's entry file":
        path.write_bytes(store.path(key_b).read_bytes())
    elif how == "old-format bare object":
        path.write_bytes(Device["CPU"].compiler.compile_uncached(to_program(kernel_a(), LLVMRenderer()).src))
    elif how == "another kernel's object under this key":  # an intact entry with the wrong object
        store.put(key, Device["CPU"].compiler.compile_uncached(src_b))
    else:
        raise AssertionError(how)


HOW = ["empty file", "truncated", "random bytes", "bit flip in the object", "another kernel's entry file",
       "old-format bare object", "another kernel's object under this key"]  # fmt: skip


@pytest.mark.parametrize("how", HOW)
def test_a_damaged_entry_heals_on_the_next_run(how: str, cold_cache: pathlib.Path) -> None:
    np.testing.assert_array_equal(compile_and_run(kernel_a(), N_A), expected_a())  # fills the cold cache
    np.testing.assert_array_equal(compile_and_run(kernel_b(), N_B), X[:N_B] - Y[:N_B] * np.float32(3))
    store, key, src = entry_of(kernel_a())
    healthy = store.path(key).read_bytes()
    damage(how, store, key)
    with pytest.warns(CacheWarning) as rec:
        got = compile_and_run(kernel_a(), N_A)
    np.testing.assert_array_equal(got, expected_a())
    msgs = [str(w.message) for w in rec if issubclass(w.category, CacheWarning)]
    if how == "another kernel's object under this key":  # the loader saw it: the program and the symbol are named
        assert len(msgs) == 1 and "program 'heal_a' did not load" in msgs[0] and "'heal_a' is not defined" in msgs[0]
    else:  # the store saw it: the file is named
        assert len(msgs) == 1 and str(store.path(key)) in msgs[0], msgs
    # a healthy entry is left behind: the same bytes as before the damage, verified, and a warning-free hit
    assert store.path(key).read_bytes() == healthy and store.verify() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        np.testing.assert_array_equal(compile_and_run(kernel_a(), N_A), expected_a())


UNDEFINED_IR = """
declare float @speck_heal_missing(float)
define void @needs_missing(ptr %o, i32 %s, i32 %e) {
  %r = call float @speck_heal_missing(float 1.0)
  store float %r, ptr %o
  ret void
}
"""


def test_an_object_that_fails_freshly_compiled_too_is_a_real_error(cold_cache: pathlib.Path) -> None:
    dev = Device["CPU"]
    spec = types.SimpleNamespace(name="needs_missing", src=UNDEFINED_IR, lib=None, renderer="llvm")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)  # no recompile warning: the fresh object is the same
        with pytest.raises(ElfLinkError, match="undefined symbol 'speck_heal_missing'"):
            dev.load_program(spec)
    bad = types.SimpleNamespace(name="k", src=None, lib=b"\x7fELF" + bytes(10), renderer="llvm")
    with pytest.raises(ElfLinkError, match="ELF object 'k': truncated ELF header"):  # no source to recompile from
        dev.load_program(bad)
