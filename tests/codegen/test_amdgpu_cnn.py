"""The main job's training step on the AMD backend: the 129 kernels of one CNN step (forward, backward, Adam; batch
128, as the tensor frontend scheduled them when tests/codegen/golden/amd/cnn_step.pkl was written by
`python3 bench/amd_codegen.py --write-golden`) all compile for gfx1100 to code objects llvm-objdump decodes, within
the hardware's limits; those whose iteration space is at most MAX_RUN_POINTS (104 of them: every elementwise,
normalization, classifier and optimizer kernel and the smaller reductions; not the 3x3/5x5 convolutions) run as GPU
programs in the interpreter to what the kernel means (eval_ast); test_amdgpu_cnn_emulated.py runs the same ones on
the RDNA3 emulator."""

from __future__ import annotations

import math
import pathlib
import subprocess
import tempfile

import numpy as np
import pytest

from codegen_amd import amd_compiler, metadata_note, tool, values
from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.lowered_cache import loads
from speck.codegen.numeric import from_storage
from speck.codegen.program import to_program
from speck.codegen.renderer.amdgpu import AMDGPURenderer
from speck.uop import Ops, UOp, dtypes

pytestmark = pytest.mark.slow
GOLDEN = pathlib.Path(__file__).parent / "golden" / "amd" / "cnn_step.pkl"
STEP: list[UOp] = loads(GOLDEN.read_bytes())
MAX_RUN_POINTS = 1_000_000


def _points(ast: UOp) -> int:
    return math.prod(int(u.src[0].arg) for u in ast.toposort() if u.op is Ops.RANGE)


def test_the_step_has_129_kernels() -> None:
    assert len(STEP) == 129 and sum(_points(a) <= MAX_RUN_POINTS for a in STEP) == 104


@pytest.mark.parametrize("i", range(len(STEP)), ids=[f"{i}-{a.arg.name}" for i, a in enumerate(STEP)])
def test_step_kernel_compiles_and_runs(i: int) -> None:
    ast = STEP[i]
    spec = to_program(ast, AMDGPURenderer(), amd_compiler())
    assert spec.lib is not None and spec.local_size is not None
    (md,) = metadata_note(spec.lib)["amdhsa.kernels"]
    assert md[".vgpr_count"] <= 256 and md[".group_segment_fixed_size"] <= 65536
    assert md[".private_segment_fixed_size"] == 0  # nothing spilled to scratch
    assert md[".reqd_workgroup_size"] == list(spec.local_size) and np.prod(spec.local_size) <= 1024
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(spec.lib)
        f.flush()
        out = subprocess.run([tool("objdump"), "--mcpu=gfx1100", "-d", f.name], capture_output=True, text=True)
    assert out.returncode == 0 and "s_endpgm" in out.stdout and "<unknown>" not in out.stdout, out.stderr
    if _points(ast) > MAX_RUN_POINTS:
        return
    rng = np.random.default_rng(i)
    params = sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg)
    bufs = [values(rng, p.dtype.base, p.dtype.size, positive=True) for p in params]  # type: ignore[attr-defined]
    ref, got = [b.copy() for b in bufs], [b.copy() for b in bufs]
    eval_ast(ast, ref)
    run_program(spec, got)
    for p in params:
        dt = p.dtype.base  # type: ignore[attr-defined]
        e, g = from_storage(ref[p.arg], dt), from_storage(got[p.arg], dt)
        if dtypes.is_float(dt):  # grouped sums add in another order
            np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=1e-4, atol=1e-4)
        else:
            np.testing.assert_array_equal(g, e)
