"""The AMD backend's code objects run on the RDNA3 emulator (speck.usbgpu.sim.rdna3) and give the reference
interpreter's results: every kernel of the AMD corpus (elementwise ops of every dtype, division, casts and bitcasts,
transcendentals, gated loads, reductions, a matmul, more axes than grid dimensions, symbolic sizes) and the
hypothesis kernel corpus, compiled for gfx1100; and the emulator's decoder reads every corpus kernel as llvm-objdump-16
does. Bit for bit: the AMD renderer computes the transcendentals with
speck's decompositions and LLVM's division and square root sequences are correctly rounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from codegen_amd import CORPUS, CORPUS_IDS, amd_compiler, corpus_spec
from codegen_helpers import assert_same, out_dtype, run_prog
from codegen_rdna3 import objdump_mismatches, run_emulated
from codegen_strategies import kernel_asts
from speck.codegen.program import to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.uop import UOp
from speck.usbgpu.sim.rdna3 import coverage_of, disassemble_kernel


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=CORPUS_IDS)
def test_emulated_gpu_program_matches_the_interpreter(i: int) -> None:
    ast, bufs, var_vals = CORPUS[i]
    spec = corpus_spec(i)
    want = run_prog(spec, bufs, var_vals)
    got, stats = run_emulated(spec, bufs, var_vals)
    assert_same(want, got[0], out_dtype(ast), exact=True)
    assert stats.instructions > 0 and stats.waves >= 1


@pytest.mark.parametrize("i", range(len(CORPUS)), ids=CORPUS_IDS)
def test_emulator_decodes_the_corpus_as_llvm_objdump_does(i: int) -> None:
    spec = corpus_spec(i)
    problems = objdump_mismatches(spec.lib)
    assert not problems, "\n".join(problems[:20])


def test_every_mnemonic_of_the_corpus_is_implemented() -> None:
    seen: set[str] = set()
    for i in range(len(CORPUS)):
        spec = corpus_spec(i)
        seen |= {inst.name for inst in disassemble_kernel(spec.lib, spec.function_name)}
    done, total, missing = coverage_of(seen)
    assert not missing, f"{done}/{total} mnemonics implemented; missing: {missing}"


@pytest.mark.slow
@given(kernel_asts())
def test_hypothesis_corpus_emulated_matches_the_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    """Random kernels (tests/codegen/codegen_strategies.py) through the AMD pipeline (GPU lowering, opts, LLVM for
    gfx1100, the code-object writer) run in the emulator to the interpreter's bits."""
    ast, inputs, var_vals = case
    spec = to_program(ast, AMDGPURenderer(), amd_compiler())
    want = run_prog(spec, inputs, var_vals)
    got, _ = run_emulated(spec, inputs, var_vals)
    assert_same(want, got[0], out_dtype(ast), exact=True)
