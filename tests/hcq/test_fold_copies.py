"""speck.hcq.runner.fold_copies (a copy out of a temporary folded into the kernel computing it) and the in-place
test it relies on, speck.codegen.program.reads_only_where_it_stores: structural cases on plain calls, and the
folded calls run on the CPU device give what the unfolded ones give."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.program import reads_only_where_it_stores
from speck.hcq.runner import Copy, Exec, Host, fold_copies
from speck.uop import AxisType, UOp, dtypes


def ew(n: int, shifted: bool = False, extra: bool = False) -> UOp:
    """out[i] = a[i] * 2 + b[i]  (shifted: + a[(i+1) % n]; extra: out[i] also stored a second time)."""
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(n))
    b = UOp.param(2, dtypes.float32.ptr(n))
    val = a.index(i).load() * 2.0 + b.index(i).load()
    if shifted:
        val = val + a.index((i + 1) % n).load()
    out = UOp.param(0, dtypes.float32.ptr(n))
    st_ = out.index(i).store(val)
    stores = [st_.end(i)]
    if extra:
        j = UOp.range(n, 1, AxisType.GLOBAL)
        stores.append(out.index(j).store(UOp.const(dtypes.float32, 0.0)).end(j))
    return UOp.sink(*stores, arg=KernelInfo("ew"))


def test_reads_only_where_it_stores() -> None:
    assert reads_only_where_it_stores(ew(16), 0, 1)
    assert reads_only_where_it_stores(ew(16), 0, 2)
    assert not reads_only_where_it_stores(ew(16, shifted=True), 0, 1)  # a[i+1] may already be overwritten
    assert reads_only_where_it_stores(ew(16, shifted=True), 0, 2)
    assert not reads_only_where_it_stores(ew(16, extra=True), 0, 1)  # two stores
    assert not reads_only_where_it_stores(ew(16), 1, 2)  # slot 1 is not what it stores


def kernel(ast: UOp | None) -> Any:
    bufs = [SimpleNamespace(slot=i) for i in range(3)]
    return SimpleNamespace(name="k", spec=SimpleNamespace(ast=ast, buffers=bufs) if ast is not None else None)


def ex(prog: Any, *args: int) -> Exec:
    return Exec(prog, tuple(args), writes=frozenset({0}))


SIZES = [64] * 6
WHERE = ["CPU"] * 6


def test_update_in_place_folds() -> None:
    k = kernel(ew(16))
    # slot 0: temp <- param(1) * 2 + grad(2); copy param <- temp
    calls = [ex(k, 0, 1, 2), Copy(1, 0, 0, 64)]
    assert fold_copies(calls, SIZES, WHERE) == [ex(k, 1, 1, 2)]


def test_readers_in_between_read_the_target() -> None:
    k = kernel(ew(16))
    calls = [ex(k, 0, 1, 2), ex(k, 3, 0, 2), Copy(1, 0, 0, 64)]
    assert fold_copies(calls, SIZES, WHERE) == [ex(k, 1, 1, 2), ex(k, 3, 1, 2)]


def test_what_keeps_a_copy() -> None:
    k, shifted, unknown = kernel(ew(16)), kernel(ew(16, shifted=True)), kernel(None)
    cases = [
        [ex(shifted, 0, 1, 2), Copy(1, 0, 0, 64)],  # the kernel reads the target elsewhere than it stores
        [ex(unknown, 0, 1, 2), Copy(1, 0, 0, 64)],  # no AST to tell
        [ex(k, 0, 3, 2), ex(k, 4, 1, 2), Copy(1, 0, 0, 64)],  # the target's old value is read in between
        [ex(k, 0, 3, 2), ex(k, 1, 3, 2), Copy(1, 0, 0, 64)],  # ... or written
        [ex(k, 0, 3, 2), Copy(1, 0, 0, 64), ex(k, 4, 0, 2)],  # the temporary is read after the copy
        [ex(k, 0, 3, 2), ex(k, 0, 3, 2), Copy(1, 0, 0, 64)],  # written twice
        [ex(k, 0, 3, 2), Copy(1, 0, 0, 32)],  # part of it
        [ex(k, 0, 3, 2), Copy(1, 0, 4, 60)],  # from an offset
        [Host(lambda b, v: None, (0,)), Copy(1, 0, 0, 64)],  # host work made it
    ]
    for calls in cases:
        assert fold_copies(calls, SIZES, WHERE) == calls, calls
    calls = [ex(k, 0, 3, 2), Copy(1, 0, 0, 64)]
    assert fold_copies(calls, SIZES, WHERE, keep={0}) == calls  # the temporary is observed afterwards
    assert fold_copies(calls, SIZES, ["CPU:0", "CPU:1", "CPU:0", "CPU:0"]) == calls  # between devices


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from([1, 7, 16, 100]), seed=st.integers(0, 2**16), reads_target=st.booleans())
def test_folded_calls_compute_what_the_copies_did(n: int, seed: int, reads_target: bool) -> None:
    """Run on the CPU device: kernel then copy, against the folded kernel storing into the target itself."""
    from speck.hcq import Buffer, Device
    from speck.hcq.runner import Plan, run

    dev: Any = Device["CPU"]
    prog = dev.load_program(dev.backend.to_program(ew(n)))
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    src = 1 if reads_target else 2  # the kernel's first operand: the target itself, or another buffer
    calls = [Exec(prog, (0, src, 3), writes=frozenset({0})), Copy(1, 0, 0, 4 * n)]
    folded = fold_copies(calls, [4 * n] * 4, ["CPU"] * 4)
    assert len(folded) == 1
    results = []
    for cs in (calls, folded):
        bufs = [Buffer("CPU", n, dtypes.float32).allocate() for _ in range(4)]
        bufs[1].copyin(memoryview(a.copy()))
        bufs[2].copyin(memoryview(a * 3))
        bufs[3].copyin(memoryview(b.copy()))
        run(Plan(cs, 4), bufs)
        results.append(bufs[1].numpy().copy())
    np.testing.assert_array_equal(results[0], results[1])
    want = (a if reads_target else a * 3) * np.float32(2) + b
    np.testing.assert_array_equal(results[0], want)
