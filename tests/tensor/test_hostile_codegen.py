"""Hostile round 4, names that reach generated code: a Variable of a very long name is named positionally in LLVM
IR (LLVM cuts local names at 1024 characters and the cut name clashed: "redefinition of argument"); names that are
no identifier (quotes, newlines, C keywords) compute like any other on every CPU backend."""

from __future__ import annotations

import pytest

from speck.tensor import Tensor, Variable


@pytest.mark.parametrize("device", ["CPU:LLVM", "CPU:CLANG", "CPU:X86"])
@pytest.mark.parametrize("name", ["x" * 65, "x" * 1100, "y" * 3000, "a;}int evil;//", "b\nc", "int", "é"], ids=repr)
def test_variables_of_any_name_compute_on_every_backend(device: str, name: str) -> None:
    v, w = Variable(name, 1, 10).bind(3), Variable(name + "2", 1, 10).bind(4)
    t = Tensor.ones(10, 10, device=device)
    assert (t[:v, :w] + 1).sum().item() == 24.0


@pytest.mark.parametrize("p", [2**20, 2**70])
def test_a_huge_int_norm_order_lowers_and_matches_numpy(p: int) -> None:
    # (the gate search of the reduction walked x ** p's chain of squares as a tree: 2**70 visits, a hang)
    import numpy as np

    a = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    with np.errstate(over="ignore"):
        want = a / np.maximum((np.abs(a) ** np.float32(p)).sum(1, keepdims=True) ** np.float32(1 / p), 1e-12)
    np.testing.assert_array_equal(Tensor(a).normalize(p).numpy(), want)


@pytest.mark.parametrize("device", ["CPU:LLVM", "CPU:CLANG", "CPU:X86"])
@pytest.mark.parametrize("name", ["i32x4", "f32x8", "u8x16", "i64x4", "boolx4"])
def test_a_variable_named_like_a_vector_type_computes(device: str, name: str) -> None:
    # the C renderer kept the name as the parameter's: it hid the vector typedef `i32x4` from the body (a clang
    # CompileError "expected ';' after expression")
    import numpy as np

    v = Variable(name, 1, 64).bind(7)
    x = np.arange(64, dtype=np.int32)
    got = (Tensor(x, device=device).contiguous() + v).reshape(16, 4).max(1)
    np.testing.assert_array_equal(got.numpy(), (x + 7).reshape(16, 4).max(1))
