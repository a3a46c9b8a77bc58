"""A kernel a backend's compiler refuses late (CompileRefused: the x86 selector meets a form it has no rule for) is
rendered again by the registry with the backend's fallback before any object exists: the program's source always
describes its object, and the x86 compiler never reaches back into the registry (no import cycle)."""

from __future__ import annotations

import numpy as np
import pytest

from speck.codegen.backends import get_backend
from speck.codegen.errors import CompileRefused
from speck.codegen.x86.compiler import X86Compiler


def _refuse_all(self: X86Compiler, src: str) -> bytes:
    raise CompileRefused(f"no selection rule (refused on purpose) for {src.splitlines()[0]}")


def test_late_refusal_gives_the_fallback_program(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from speck.tensor import Tensor
    from speck.tensor.schedule import Scheduler

    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(X86Compiler, "compile_uncached", _refuse_all)
    a = Tensor(np.arange(8, dtype=np.float32), device="CPU:X86").realize()
    sched = Scheduler("CPU:X86")
    sched.realize((a * 2 + 1).uop)
    ast = next(it.ast for it in sched.items if it.ast is not None)
    x86 = get_backend("X86")
    spec = x86.to_program(ast)
    llvm = get_backend(x86.fallback or "")
    assert spec.renderer == llvm.renderer.name and "define" in spec.src  # LLVM IR, and LLVM's object
    assert spec.lib == llvm.compiler_for(spec).compile(spec.src)
    with pytest.raises(CompileRefused):  # a backend without a fallback raises the refusal
        llvm.refused(ast, CompileRefused("refused on purpose"))


def test_late_refusal_in_a_compile_ahead_runs_on_the_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from speck.tensor import Tensor
    from speck.tensor import realize as R

    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(X86Compiler, "compile_uncached", _refuse_all)
    monkeypatch.setattr(R, "_program_cache", R.ProgramCache(64))
    monkeypatch.setattr(R.COMPILE_THREADS, "value", 1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x, device="CPU:X86").realize()
    got = (t.exp().sum(1) * t.max() + t.min()).numpy()  # several new kernels: compiled ahead
    np.testing.assert_allclose(got, np.exp(x).sum(1) * x.max() + x.min(), rtol=1e-5)
    # (kernels compiled in the pool's worker processes were not refused there): every program's source describes
    # its object - LLVM IR with LLVM's object, or x86 program text with the encoder's listing inside
    from speck.codegen.x86.elf_object import read_listing

    progs = [p for p in R._program_cache.values() if isinstance(p, R.Kernel)]
    assert progs
    for p in progs:
        if p.spec.renderer == get_backend("LLVM").renderer.name:
            assert "define" in p.spec.src and read_listing(p.spec.lib) is None
        else:
            assert read_listing(p.spec.lib) is not None
