"""The 129 kernels of the main job's training step (tests/codegen/golden/amd/cnn_step.pkl: batch 128, forward,
backward and Adam) on the RDNA3 emulator (speck.usbgpu.sim.rdna3): the emulator's decoder reads every one as
llvm-objdump-16 does, implements every mnemonic they contain, and runs those test_amdgpu_cnn.py runs in the
interpreter (iteration space at most MAX_RUN_POINTS: 104 of them) to the interpreter's bits on the same inputs. The
convolutions left out at batch 128 run at batch 2 in tests/integration/test_amd_step_emulated.py."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from codegen_amd import amd_compiler, values
from codegen_helpers import assert_same, out_dtype, run_prog
from codegen_rdna3 import objdump_mismatches, run_emulated
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.uop import Ops
from speck.usbgpu.sim.rdna3 import coverage_of, disassemble_kernel
from test_amdgpu_cnn import MAX_RUN_POINTS, STEP, _points

pytestmark = pytest.mark.slow
RUN = [i for i, ast in enumerate(STEP) if _points(ast) <= MAX_RUN_POINTS]


@cache
def spec(i: int) -> ProgramSpec:
    return to_program(STEP[i], AMDGPURenderer(), amd_compiler())


@pytest.mark.parametrize("i", RUN, ids=[f"{i}-{STEP[i].arg.name}" for i in RUN])
def test_step_kernel_runs_emulated_to_the_interpreters_bits(i: int) -> None:
    ast, s = STEP[i], spec(i)
    rng = np.random.default_rng(i)
    params = sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg)
    bufs = [values(rng, p.dtype.base, p.dtype.size, positive=True) for p in params]  # type: ignore[attr-defined]
    want = run_prog(s, bufs, {})
    got, stats = run_emulated(s, bufs, {})
    assert_same(want, got[0], out_dtype(ast), exact=True)
    assert stats.waves >= 1 and stats.instructions >= stats.waves


def test_every_step_kernel_decodes_as_llvm_objdump_does_and_is_implemented() -> None:
    problems: list[str] = []
    seen: set[str] = set()
    for i in range(len(STEP)):
        s = spec(i)
        assert s.lib is not None
        problems += [f"kernel {i} {s.name}: {p}" for p in objdump_mismatches(s.lib)]
        seen |= {inst.name for inst in disassemble_kernel(s.lib, s.function_name)}
    assert not problems, "\n".join(problems[:20])
    done, total, missing = coverage_of(seen)
    assert not missing, f"{done}/{total} mnemonics of the step implemented; missing: {missing}"
