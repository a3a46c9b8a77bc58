"""Tensor.custom_kernel: kernels written in UOps run through codegen on every CPU backend, match numpy, are one
kernel each (nothing fused into them), order against other work on their buffers, differentiate through grad_fxn,
and bad kernels fail at build time with errors that say what is wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.kernel_info import KernelInfo
from speck.tensor import KernelCountException, Tensor, TinyJit, assert_kernel_count
from speck.tensor.custom_kernel import CustomKernelError
from speck.uop import AddrSpace, AxisType, UOp
from tensor_helpers import FEW

DEVICES = ["CPU:LLVM", pytest.param("CPU:CLANG", marks=pytest.mark.c_backend), "CPU:X86", "PYTHON"]


# ---------------- kernels ----------------
def arange_kernel(C: UOp) -> UOp:
    i = UOp.range(C.size, 0)
    return C[i].store(i.cast(C.dtype.base)).end(i).sink(arg=KernelInfo(name=f"custom_arange_{C.size}"))


def eye_kernel(C: UOp) -> UOp:
    i, j = UOp.range(C.shape[0], 0), UOp.range(C.shape[1], 1)
    return C[i, j].store(i.eq(j).cast(C.dtype.base)).end(i, j).sink(arg=KernelInfo(name="custom_eye"))


def add_one_kernel(B: UOp, A: UOp) -> UOp:
    A, B = A.flatten(), B.flatten()
    i = UOp.range(A.size, 0)
    return B[i].store(A[i] + 1).end(i).sink(arg=KernelInfo(name="custom_add_one"))


def add_kernel(C: UOp, A: UOp, B: UOp) -> UOp:
    C, A, B = C.flatten(), A.flatten(), B.flatten()
    i = UOp.range(C.size, 0)
    return C[i].store(A[i] + B[i]).end(i).sink(arg=KernelInfo(name="custom_add"))


def add_mul_kernel(C: UOp, D: UOp, A: UOp, B: UOp) -> UOp:
    C, D, A, B = C.flatten(), D.flatten(), A.flatten(), B.flatten()
    i = UOp.range(C.size, 0)
    return UOp.group(C[i].store(A[i] + B[i]), D[i].store(A[i] * B[i])).end(i).sink(arg=KernelInfo(name="addmul"))


def gemm_kernel(C: UOp, A: UOp, B: UOp) -> UOp:
    i, j = UOp.range(C.shape[0], 0), UOp.range(C.shape[1], 1)
    k = UOp.range(A.shape[1], 2, AxisType.REDUCE)
    C = C[i, j].set(0.0)
    C = C[i, j].set(C.after(k)[i, j] + A[i, k] * B[k, j], end=k)
    return C.end(i, j).sink(arg=KernelInfo(name="custom_gemm", opts_to_apply=()))


def sum_kernel(B: UOp, A: UOp) -> UOp:
    i = UOp.range(A.shape[0], 0, AxisType.REDUCE)
    B = B[0].set(0.0)
    B = B[0].set(B.after(i)[0] + A[i], end=i)
    return B.sink(arg=KernelInfo(name="custom_sum", opts_to_apply=()))


def flip_contract_kernel(dest: UOp, src: UOp) -> UOp:
    i = UOp.range(dest.shape[0], 0)
    j = UOp.range(dest.shape[1], 1, AxisType.UPCAST)
    vec = src[i, j].contract(j)
    n = dest.shape[1]
    store = UOp.group(*[dest[i, k].store(vec.gep(n - 1 - k)) for k in range(n)])
    return store.end(i).sink(arg=KernelInfo(name="custom_flip", opts_to_apply=()))


def row_sum_kernel(dest: UOp, src: UOp) -> UOp:
    """Slices: src[g, :] is a row view indexed by the reduce range."""
    g = UOp.range(src.shape[0], 0)
    r = UOp.range(src.shape[1], 1, AxisType.REDUCE)
    row = src[g, :]
    return dest[g].store(row[r].reduce(r)).end(g).sink(arg=KernelInfo(name="row_sum"))


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


# ---------------- the examples, against numpy, on every CPU backend ----------------
@pytest.mark.parametrize("device", DEVICES)
def test_arange_and_eye(device: str) -> None:
    with assert_kernel_count(1):
        a = Tensor.custom_kernel(Tensor.empty(10, device=device), fxn=arange_kernel)[0].numpy()
    np.testing.assert_array_equal(a, np.arange(10, dtype=np.float32))
    with assert_kernel_count(1):
        e = Tensor.custom_kernel(Tensor.empty(4, 6, device=device), fxn=eye_kernel)[0].numpy()
    np.testing.assert_array_equal(e, np.eye(4, 6, dtype=np.float32))


@pytest.mark.parametrize("device", DEVICES)
def test_elementwise(device: str) -> None:
    an, bn = _rand(5, 7, seed=1), _rand(5, 7, seed=2)
    a, b = Tensor(an, device=device), Tensor(bn, device=device)
    with assert_kernel_count(1):
        one = a.custom_kernel(a, fxn=lambda B, A: add_one_kernel(B, A))[0].numpy()  # one buffer read and written
    np.testing.assert_allclose(one, an + 1)
    with assert_kernel_count(1):
        c = Tensor.custom_kernel(Tensor.empty(5, 7, device=device), Tensor(an, device=device), b, fxn=add_kernel)[0]
        got = c.numpy()
    np.testing.assert_allclose(got, an + bn)
    with assert_kernel_count(1):
        c, d = Tensor.custom_kernel(Tensor.empty(5, 7, device=device), Tensor.empty(5, 7, device=device), b, b,
                                    fxn=add_mul_kernel)[:2]  # fmt: skip
        Tensor.realize(c, d)
    np.testing.assert_allclose(c.numpy(), bn + bn)
    np.testing.assert_allclose(d.numpy(), bn * bn)


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_sum_flip(device: str) -> None:
    an, bn = _rand(6, 5, seed=3), _rand(5, 4, seed=4)
    a, b = Tensor(an, device=device), Tensor(bn, device=device)
    with assert_kernel_count(1):
        c = Tensor.custom_kernel(Tensor.invalids(6, 4, device=device), a, b, fxn=gemm_kernel)[0].numpy()
    np.testing.assert_allclose(c, an @ bn, rtol=1e-5, atol=1e-5)
    v = _rand(100, seed=5)
    with assert_kernel_count(1):
        s = Tensor.custom_kernel(Tensor.empty(1, device=device), Tensor(v, device=device), fxn=sum_kernel)[0]
        got = s.numpy()
    np.testing.assert_allclose(got, [v.sum()], rtol=1e-5)
    f = _rand(3, 4, seed=6)
    with assert_kernel_count(1):
        out = Tensor.custom_kernel(Tensor.empty(3, 4, device=device), Tensor(f, device=device),
                                   fxn=flip_contract_kernel)[0].numpy()  # fmt: skip
    np.testing.assert_array_equal(out, f[:, ::-1])


def test_slices_and_reduce() -> None:
    x = _rand(5, 8, seed=7)
    with assert_kernel_count(1):
        out = Tensor.custom_kernel(Tensor.empty(5), Tensor(x), fxn=row_sum_kernel)[0].numpy()
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-6)


@FEW
@given(n=st.integers(1, 40), m=st.integers(1, 6))
def test_gemm_property(n: int, m: int) -> None:
    """Any sizes: the hand-written gemm equals numpy's."""
    an, bn = _rand(n, m, seed=n), _rand(m, 3, seed=m)
    c = Tensor.custom_kernel(Tensor.empty(n, 3), Tensor(an), Tensor(bn), fxn=gemm_kernel)[0]
    np.testing.assert_allclose(c.numpy(), an @ bn, rtol=1e-5, atol=1e-5)


def test_kernel_info_name_and_opts() -> None:
    from speck.tensor.custom_kernel import lower_custom_kernel

    C = UOp.placeholder((8,), Tensor.empty(1).dtype, 0)
    ast, writes = lower_custom_kernel(add_one_kernel(C, UOp.placeholder((8,), C.dtype.base, 1)))
    assert ast.arg.name == "custom_add_one" and writes == frozenset({0})
    g, _ = lower_custom_kernel(gemm_kernel(UOp.placeholder((2, 2), C.dtype.base, 0),
                                           UOp.placeholder((2, 3), C.dtype.base, 1),
                                           UOp.placeholder((3, 2), C.dtype.base, 2)))  # fmt: skip
    assert g.arg.dont_opt and g.arg.opts == ()  # opts_to_apply=() means no optimization
    assert KernelInfo(opts_to_apply=()).dont_opt and KernelInfo(opts_to_apply=None).dont_opt is False


# ---------------- scheduling ----------------
def test_nothing_fuses_into_it_and_consumers_are_separate() -> None:
    an, bn = _rand(4, 4, seed=8), _rand(4, 4, seed=9)
    a, b = Tensor(an), Tensor(bn)
    with assert_kernel_count(4):  # (a*2) and (b+1) are realized first; (c*3) is a kernel of its own
        c = Tensor.custom_kernel(Tensor.empty(4, 4), a * 2, b + 1, fxn=add_kernel)[0]
        got = (c * 3).numpy()
    np.testing.assert_allclose(got, (an * 2 + bn + 1) * 3, rtol=1e-6)
    with pytest.raises(KernelCountException):
        with assert_kernel_count(1):
            Tensor.custom_kernel(Tensor.empty(4, 4), a * 2, b, fxn=add_kernel)[0].realize()


def test_writes_in_place_and_read_only_inputs_unchanged() -> None:
    an = _rand(6, seed=10)
    a = Tensor(an)
    out = Tensor.empty(6)
    res = Tensor.custom_kernel(out, a, fxn=add_one_kernel)
    res[0].realize()
    np.testing.assert_allclose(out.numpy(), an + 1)  # the empty buffer was written in place
    np.testing.assert_array_equal(res[1].numpy(), an)  # the read-only argument comes back unchanged
    np.testing.assert_array_equal(a.numpy(), an)


def test_written_lazy_argument_keeps_its_own_value() -> None:
    """An argument the kernel writes that something else also reads is copied, so that reader sees its value."""
    an = _rand(5, seed=11)
    lazy = Tensor(an) * 2
    after = Tensor.custom_kernel(lazy, fxn=arange_kernel)[0]
    both = Tensor.stack(after, lazy + 0)
    np.testing.assert_allclose(both.numpy(), np.stack([np.arange(5, dtype=np.float32), an * 2]))


def test_ordered_against_later_work_on_its_buffer() -> None:
    base = Tensor(_rand(8, seed=12)).realize()
    k1 = Tensor.custom_kernel(base, fxn=arange_kernel)[0]
    k2 = Tensor.custom_kernel(k1, Tensor.empty(8), fxn=lambda A, B: add_one_kernel(A, A))[0]
    np.testing.assert_array_equal(k2.numpy(), np.arange(8, dtype=np.float32) + 1)


def test_captured_by_tinyjit() -> None:
    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return Tensor.custom_kernel(Tensor.empty(3, 3), x, y, fxn=gemm_kernel)[0] + 1

    for seed in range(4):
        xn, yn = _rand(3, 3, seed=seed), _rand(3, 3, seed=seed + 10)
        got = step(Tensor(xn), Tensor(yn)).numpy()
        np.testing.assert_allclose(got, xn @ yn + 1, rtol=1e-5, atol=1e-5)


# ---------------- gradients ----------------
def _gemm_backward(grad: UOp, call: UOp) -> tuple[UOp | None, ...]:
    _, a, b = call.src
    ga = Tensor.empty(*a.shape).custom_kernel(Tensor(grad), Tensor(b).T, fxn=gemm_kernel)[0]
    gb = Tensor.empty(*b.shape).custom_kernel(Tensor(a).T, Tensor(grad), fxn=gemm_kernel)[0]
    return (None, ga.uop, gb.uop)


def test_gemm_backward_is_two_custom_gemms() -> None:
    an, bn, gn = _rand(6, 5, seed=13), _rand(5, 3, seed=14), _rand(6, 3, seed=15)
    a, b = Tensor(an, requires_grad=True), Tensor(bn, requires_grad=True)
    c = Tensor.custom_kernel(Tensor.empty(6, 3), a, b, fxn=gemm_kernel, grad_fxn=_gemm_backward)[0]
    (c * Tensor(gn)).sum().backward()
    assert a.grad is not None and b.grad is not None
    # two gemms, the two transposes they read, and the product c*g that is the gradient of c
    with assert_kernel_count(5):
        Tensor.realize(a.grad, b.grad)
    np.testing.assert_allclose(a.grad.numpy(), gn @ bn.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), an.T @ gn, rtol=1e-5, atol=1e-5)


def test_no_grad_fxn_is_a_clear_error() -> None:
    a = Tensor(_rand(4, seed=16), requires_grad=True)
    out = Tensor.custom_kernel(Tensor.empty(4), a, fxn=add_one_kernel)[0]
    with pytest.raises(CustomKernelError, match="no grad_fxn"):
        out.sum().backward()


def test_grad_fxn_wrong_count() -> None:
    a = Tensor(_rand(4, seed=17), requires_grad=True)
    out = Tensor.custom_kernel(Tensor.empty(4), a, fxn=add_one_kernel, grad_fxn=lambda g, call: (g,))[0]
    with pytest.raises(CustomKernelError, match="1 gradient"):
        out.sum().backward()


# ---------------- errors ----------------
def _store_past_end(C: UOp) -> UOp:
    i = UOp.range(C.shape[0], 0)
    return C[i + 1].store(1.0).end(i).sink()


def _store_past_row(C: UOp) -> UOp:
    i, j = UOp.range(C.shape[0], 0), UOp.range(C.shape[1], 1)
    return C[i, j + 2].store(1.0).end(i, j).sink()


@pytest.mark.parametrize("fxn", [_store_past_end, _store_past_row])
def test_out_of_bounds_store_fails_at_build(fxn: Any) -> None:
    with pytest.raises(CustomKernelError, match=r"outside \[0, \d+\]"):
        Tensor.custom_kernel(Tensor.empty(4, 4) if fxn is _store_past_row else Tensor.empty(8), fxn=fxn)


def test_int_index_out_of_bounds() -> None:
    with pytest.raises(IndexError, match="out of bounds"):
        Tensor.custom_kernel(Tensor.empty(4), fxn=lambda C: C[4].store(1.0).sink())


def test_no_stores() -> None:
    def reads_only(C: UOp, A: UOp) -> UOp:
        i = UOp.range(A.size, 0)
        return UOp.sink(A[i].reduce(i))

    with pytest.raises(CustomKernelError, match="stores nothing"):
        Tensor.custom_kernel(Tensor.empty(1), Tensor.empty(4), fxn=reads_only)


@pytest.mark.parametrize("n", [1, 3])
def test_wrong_number_of_uops(n: int) -> None:
    with pytest.raises(CustomKernelError, match=f"can't take the {n} UOp"):
        Tensor.custom_kernel(*[Tensor.empty(4) for _ in range(n)], fxn=add_one_kernel)


def test_unclosed_range_and_bad_return() -> None:
    def unclosed(C: UOp) -> UOp:
        i = UOp.range(C.size, 0)
        return C[i].store(1.0).sink()

    with pytest.raises(CustomKernelError, match="never closed"):
        Tensor.custom_kernel(Tensor.empty(4), fxn=unclosed)
    with pytest.raises(CustomKernelError, match="must return a SINK"):
        Tensor.custom_kernel(Tensor.empty(4), fxn=lambda C: C[0].store(1.0))


def test_readers_in_the_same_schedule_see_the_old_values() -> None:
    """A realized buffer the kernel would write in place, read by another graph realized with it: that graph sees
    the values from before the kernel (the kernel writes a copy), in either realize order."""
    an = _rand(6, seed=20)
    for order in (0, 1):
        a = Tensor(an).realize()
        before = a * 10
        after = Tensor.custom_kernel(a, fxn=arange_kernel)[0]
        Tensor.realize(*((before, after) if order else (after, before)))
        np.testing.assert_allclose(before.numpy(), an * 10, rtol=1e-6)
        np.testing.assert_array_equal(after.numpy(), np.arange(6, dtype=np.float32))
    c = Tensor(an).realize()
    Tensor.custom_kernel(c, fxn=arange_kernel)[0].realize()  # alone: written in place
    np.testing.assert_array_equal(c.numpy(), np.arange(6, dtype=np.float32))


def slice_sum_kernel(dest: UOp, src: UOp) -> UOp:
    """A register accumulator: reset per row inside g, updated inside r, read after r closes."""
    g = UOp.range(src.shape[0], 0)
    row = src[g, :]
    reg = UOp.placeholder((1,), dest.dtype.base, 0, addrspace=AddrSpace.REG)
    reg = reg.after(g)[0].set(0)
    r = UOp.range(src.shape[1], 1, AxisType.REDUCE)
    reg = reg[0].set(reg.after(r)[0] + row[r], end=r)
    return dest[g].set(reg[0], end=g).sink(arg=KernelInfo(name="slice_sum", opts_to_apply=()))


@pytest.mark.parametrize("device", DEVICES)
def test_register_accumulator(device: str) -> None:
    x = _rand(6, 9, seed=21)
    with assert_kernel_count(1):
        out = Tensor.custom_kernel(Tensor.empty(6, device=device), Tensor(x, device=device),
                                   fxn=slice_sum_kernel)[0].numpy()  # fmt: skip
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-6)
