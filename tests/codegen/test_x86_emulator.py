"""The x86-64 emulator (codegen_x86emu.py) as a test oracle.

1. On this AVX2 host it must agree bit for bit with native execution: the hypothesis kernel corpus and the
   hand-written kernels of test_x86_kernels are compiled by the x86 backend, run natively (gcc-linked, ctypes) and
   emulated; every buffer is compared with same_bits.
2. EVEX semantics that cannot run here (zmm, xmm16-31, opmasks, embedded broadcast, masked loads/stores) are checked
   on tiny objects - built with speck's encoder where it has the form, else assembled by GNU as - against numpy.
3. The emulator's own numerics (single-rounding FMA, integer-indefinite conversions, NaN rules) against exact
   references.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings

import test_x86_kernels as tk
from codegen_strategies import kernel_asts
from codegen_x86emu import EmulationError, EmuStats, emulate
from speck.codegen.program import ProgramSpec
from speck.uop import UOp

pytestmark = [pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("objdump") is None,
                                 reason="gcc links the native objects; objdump decodes for the emulator"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                         "ignore:invalid value encountered:RuntimeWarning")]  # fmt: skip


def emulate_spec(spec: ProgramSpec, inputs: list[np.ndarray], var_vals: dict[str, int],
                 slices: list[tuple[int, int]]) -> tuple[list[np.ndarray], EmuStats]:  # fmt: skip
    """run_x86's calling convention, emulated: one call per (core_start, core_end) slice over copies of the inputs."""
    assert spec.lib is not None
    bufs = [b.copy() for b in inputs]
    stats = EmuStats()
    for lo, hi in slices:
        st = emulate(spec.lib, spec.name, [*[bufs[b.slot] for b in spec.buffers],
                                           *[var_vals[v] for v in spec.var_names], lo, hi])  # fmt: skip
        stats.instructions += st.instructions
        stats.mnemonics.update(st.mnemonics)
        stats.forms.update(st.forms)
    return bufs, stats


def agree_with_native(spec: ProgramSpec, inputs: list[np.ndarray], var_vals: dict[str, int]) -> EmuStats:
    n = int(spec.launch_dims(var_vals)[0]) if spec.global_size else 1
    slices = [(0, n // 2), (n // 2, n)]
    want = tk.run_x86(spec, inputs, var_vals, slices)
    got, stats = emulate_spec(spec, inputs, var_vals, slices)
    for b in spec.buffers:
        assert tk.same_bits(got[b.slot], want[b.slot], b.dtype), (
            f"buffer {b.slot} ({b.dtype}): emulated {got[b.slot]}\n native {want[b.slot]}\n{tk.asm(spec)}"
        )
    return stats


AGREED: list[str] = []  # kernels checked in this session (the report's figure)


def emu_check(ast: UOp, inputs: list[np.ndarray], var_vals: dict[str, int], vs_ast: bool = True,
              optimize: bool = True) -> ProgramSpec:  # fmt: skip
    """test_x86_kernels.check's signature: compile, then emulated == native."""
    spec = tk.x86_program(ast, optimize)
    agree_with_native(spec, inputs, var_vals)
    AGREED.append(spec.name)
    return spec


# ---------------------------------------------------------------------------------------------------------------------
# 1. differential against native execution


@given(kernel_asts(max_depth=2))
@settings(max_examples=25, deadline=None)
def test_corpus_emulated_matches_native(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    ast, inputs, var_vals = case
    ast, inputs = tk.without_narrow_floats(ast, inputs)
    emu_check(ast, inputs, var_vals)
    emu_check(ast, inputs, var_vals, optimize=False)


HAND_WRITTEN: list[Callable[[], None]] = [
    tk.test_elementwise_all_int_ops_on_special_values,
    tk.test_float_ops_and_casts_on_special_values,
    tk.test_int_to_float_casts,
    tk.test_row_reduction_and_symbolic_size,
    tk.test_register_pressure_forces_spills,
    tk.test_loop_carried_spilled_value,
]


@pytest.mark.parametrize("test", HAND_WRITTEN, ids=lambda t: t.__name__)
def test_hand_written_kernels_emulated_match_native(test: Callable[[], None], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tk, "check", emu_check)
    before = len(AGREED)
    test()
    assert len(AGREED) > before


@pytest.mark.parametrize("name", sorted(tk._vector_kernels()))
def test_vector_kernels_emulated_match_native(name: str) -> None:
    ast, inputs = tk._vector_kernels()[name]
    stats = agree_with_native(tk.x86_program(ast), inputs, {})
    assert any(f.split()[0].startswith("v") and "ymm" in f for f in stats.forms), stats.forms
