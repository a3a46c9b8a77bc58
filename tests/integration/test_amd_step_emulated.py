"""Every kernel of the main job's training step (the classic CNN, forward, backward and Adam, on a batch of 2)
compiled for gfx1100 by the AMD backend runs in the RDNA3 emulator (speck.usbgpu.sim.rdna3) to the reference
interpreter's bits. The kernel ASTs come from a CPU training step's program cache; each is lowered for the GPU,
compiled to an HSA code object, and run both in the interpreter and in the emulator on the same random inputs."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
from codegen_amd import amd_compiler, values
from codegen_helpers import assert_same, out_dtype, run_prog
from codegen_rdna3 import objdump_mismatches, run_emulated

from speck.codegen.numeric import storage_np
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.uop import Ops, UOp, dtypes
from speck.usbgpu.sim.rdna3 import coverage_of, disassemble_kernel

pytestmark = pytest.mark.slow
BATCH = 2


@cache
def step_kernels() -> list[tuple[UOp, dict[str, int]]]:
    """The distinct kernels (AST, variable values) a jitted CNN training step on CPU (batch BATCH) runs, in the
    order of the capture."""
    from speck.tensor import Tensor, TinyJit
    from speck.tensor.examples.train import MODELS
    from speck.tensor.nn.optim import Adam
    from speck.tensor.nn.state import get_parameters

    Tensor.manual_seed(0)
    model = MODELS["cnn"]()
    opt = Adam(get_parameters(model), lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((BATCH, 1, 28, 28), dtype=np.float32)).realize()
    y = Tensor(rng.integers(0, 10, BATCH).astype(np.int32)).realize()

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb).sparse_categorical_crossentropy(yb)
            loss.backward()
            opt.step(loss)
        return loss

    for _ in range(2):  # run, then capture
        step(x, y).item()
    out: dict[UOp, dict[str, int]] = {}
    for ei in step.jit_cache:  # the capture's calls as ExecItems; copies have no AST
        if ei.si.ast is not None:
            out.setdefault(ei.si.ast, dict(ei.si.var_vals))
    return list(out.items())


@cache
def spec(i: int) -> ProgramSpec:
    return to_program(step_kernels()[i][0], AMDGPURenderer(), amd_compiler())


def inputs(ast: UOp, seed: int) -> list[np.ndarray]:
    """Zeros for the output, random values for the rest (integer buffers in 0..9: labels and indices stay valid)."""
    rng = np.random.default_rng(seed)
    params = sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg)
    out = []
    for p in params:
        dt = p.dtype.base  # type: ignore[attr-defined]
        size = p.dtype.size  # type: ignore[attr-defined]
        if p.arg == 0:
            out.append(np.zeros(size, storage_np(dt)))
        elif dtypes.is_int(dt) and dt != dtypes.bool:
            out.append(rng.integers(0, 10, size).astype(storage_np(dt)))
        else:
            out.append(values(rng, dt, size))
    return out


def test_every_step_kernel_runs_emulated_to_the_interpreters_bits() -> None:
    kernels = step_kernels()
    assert len(kernels) >= 90  # the CNN's forward, backward and optimizer kernels (99 distinct at batch 2)
    failures = []
    for i, (ast, var_vals) in enumerate(kernels):
        s = spec(i)
        bufs = inputs(ast, i)
        want = run_prog(s, bufs, var_vals)
        got, stats = run_emulated(s, bufs, var_vals)
        try:
            assert_same(want, got[0], out_dtype(ast), exact=True)
        except AssertionError as e:
            failures.append(f"kernel {i} {s.name}: {str(e)[:300]}")
        assert stats.instructions > 0 and stats.waves >= 1
    assert not failures, "\n".join(failures)


def test_every_mnemonic_of_the_step_is_implemented() -> None:
    seen: Counter[str] = Counter()
    for i in range(len(step_kernels())):
        seen.update(inst.name for inst in disassemble_kernel(spec(i).lib or b"", spec(i).function_name))
    done, total, missing = coverage_of(seen)
    assert not missing, f"{done}/{total} mnemonics implemented; missing: {missing}"


def test_emulator_decodes_every_step_kernel_as_llvm_objdump_does() -> None:
    problems = []
    for i in range(len(step_kernels())):
        problems += [f"kernel {i} {spec(i).name}: {p}" for p in objdump_mismatches(spec(i).lib or b"")]
    assert not problems, "\n".join(problems[:20])
