"""Creation from Python/numpy data and the factory functions, the counter-based RNG, the realization API
(numpy/tolist/item/data/contiguous/clone/to), symbolic shapes, DEBUG output and the sibling version check."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from speck.tensor import Context, Device, GlobalCounters, Tensor, Variable, dtypes
from tensor_helpers import assert_matches


@pytest.mark.parametrize("data,dtype", [
    (3, dtypes.weakint), (2.5, dtypes.weakfloat), (True, dtypes.bool), ([1, 2, 3], dtypes.int32),
    ([1.0, 2], dtypes.float32), ([[True, False]], dtypes.bool), ((1, (2)), dtypes.int32), ([], dtypes.float32),
    (b"\x01\x02\xff", dtypes.uint8),
])  # fmt: skip
def test_from_python(data: Any, dtype: Any) -> None:
    t = Tensor(data)
    assert t.dtype == dtype
    ref = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else np.array(data)
    assert t.shape == ref.shape
    assert_matches(t.numpy().astype(np.float64), ref.astype(np.float64))


@pytest.mark.parametrize("np_dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int16, np.uint16,
                                      np.int32, np.uint32, np.int64, np.uint64, np.bool_])  # fmt: skip
def test_from_numpy_roundtrip(np_dtype: Any) -> None:
    a = (np.arange(12).reshape(3, 4) % 5).astype(np_dtype)
    t = Tensor(a)
    assert t.numpy().dtype == a.dtype and t.shape == (3, 4)
    assert_matches(t.numpy(), a)
    assert t.tolist() == a.tolist()
    assert_matches(Tensor(a, dtype=dtypes.float32).numpy(), a.astype(np.float32))


def test_factories() -> None:
    assert_matches(Tensor.zeros(2, 3).numpy(), np.zeros((2, 3), np.float32))
    assert_matches(Tensor.ones((2, 3), dtype=dtypes.int8).numpy(), np.ones((2, 3), np.int8))
    assert_matches(Tensor.full((2,), 7).numpy(), np.full((2,), 7, np.int32))
    assert Tensor.empty(4, 5).shape == (4, 5)
    for args in ((5,), (2, 11, 3), (10, 0, -2), (0, 1, 0.25), (3, 3)):
        assert_matches(Tensor.arange(*args).numpy(), np.arange(*args))
    assert Tensor.arange(5).dtype == dtypes.int32 and Tensor.arange(0, 1, 0.5).dtype == dtypes.float32
    assert_matches(Tensor.linspace(-1, 2, 7).numpy(), np.linspace(-1, 2, 7, dtype=np.float32), atol=1e-6)
    assert_matches(Tensor.eye(3, 4).numpy(), np.eye(3, 4, dtype=np.float32))
    t = Tensor([[1, 2], [3, 4]])
    assert_matches(t.zeros_like().numpy(), np.zeros((2, 2), np.int32))
    assert_matches(t.ones_like(dtype=dtypes.float32).numpy(), np.ones((2, 2), np.float32))
    assert_matches(t.full_like(9).numpy(), np.full((2, 2), 9, np.int32))
    assert t.empty_like().shape == (2, 2)


def test_rng_is_reproducible_and_well_distributed() -> None:
    Tensor.manual_seed(1234)
    a = Tensor.rand(2000).numpy()
    b = Tensor.rand(2000).numpy()
    Tensor.manual_seed(1234)
    assert_matches(Tensor.rand(2000).numpy(), a)
    assert not np.array_equal(a, b)
    assert a.min() >= 0 and a.max() < 1 and abs(a.mean() - 0.5) < 0.03
    n = Tensor.randn(4000).numpy()
    assert abs(n.mean()) < 0.08 and abs(n.std() - 1) < 0.08
    r = Tensor.randint(3000, low=-2, high=3).numpy()
    assert r.dtype == np.int32 and set(np.unique(r)) == {-2, -1, 0, 1, 2}
    u = Tensor.uniform(1000, low=2.0, high=3.0).numpy()
    assert u.min() >= 2 and u.max() < 3
    assert abs(Tensor.normal(4000, mean=3.0, std=0.5).numpy().std() - 0.5) < 0.05
    p = Tensor.randperm(50).numpy()
    assert sorted(p.tolist()) == list(range(50))
    for f in (Tensor.scaled_uniform, Tensor.glorot_uniform, Tensor.kaiming_uniform, Tensor.kaiming_normal):
        w = f(16, 8).numpy()
        assert w.shape == (16, 8) and np.isfinite(w).all() and w.std() > 0
    x = Tensor.ones(3, 4)
    assert x.rand_like().shape == (3, 4) and x.randn_like().dtype == dtypes.float32


def test_rng_same_values_on_another_device() -> None:
    """Counter-based: the PYTHON device (reference interpreter) draws the same numbers as the CPU."""
    Tensor.manual_seed(7)
    a = Tensor.rand(64).numpy()
    Tensor.manual_seed(7)
    b = Tensor.rand(64, device="PYTHON").numpy()
    assert_matches(b, a)


def test_multinomial() -> None:
    Tensor.manual_seed(3)
    w = Tensor([0.0, 1.0, 3.0])
    s = w.multinomial(2000, replacement=True).numpy()
    assert set(np.unique(s)) <= {1, 2} and abs((s == 2).mean() - 0.75) < 0.05
    s2 = Tensor([[1.0, 0.0], [0.0, 1.0]]).multinomial(1).numpy()
    assert s2.tolist() == [[0], [1]]


def test_realization_api() -> None:
    t = Tensor([[1.5, 2.5], [3.5, 4.5]])
    assert t.shape == (2, 2) and t.ndim == 2 and t.numel() == 4 and t.nbytes() == 16 and t.dtype == dtypes.float32
    assert t.device == Device.DEFAULT
    assert t.sum().item() == 12.0 and isinstance(t.sum().item(), float)
    assert t.tolist() == [[1.5, 2.5], [3.5, 4.5]]
    assert Tensor(3).item() == 3 and Tensor(3).tolist() == 3
    mv = t.data()
    assert mv.shape == (2, 2) and mv.tolist() == [[1.5, 2.5], [3.5, 4.5]]
    c = t.clone().realize()
    assert c.tolist() == t.tolist() and c.uop is not t.uop
    assert t.contiguous().realize().tolist() == t.tolist()
    b = Tensor([True, False]).realize()
    c1, c2 = b.clone().realize(), b.clone().realize()
    c1.assign(Tensor([False, False]))
    assert c1.tolist() == [False, False] and c2.tolist() == [True, False] and b.tolist() == [True, False]
    assert t.to(t.device) is t
    with pytest.raises(RuntimeError, match="exactly 1 element"):
        t.item()


def test_to_other_device_copies() -> None:
    t = Tensor([1, 2, 3]) * 2
    p = t.to("PYTHON")
    assert p.device == "PYTHON" and p.tolist() == [2, 4, 6]
    back = (p + 1).to(t.device)
    assert back.tolist() == [3, 5, 7]


def test_symbolic_shapes_share_one_compiled_kernel() -> None:
    from speck.tensor.realize import compiled_program_count

    base = Tensor.arange(64).float().realize()
    v = Variable("n", 1, 64)
    results = []
    before = None
    for val in (3, 17, 40):
        t = base.shrink(((0, v.bind(val)),))
        results.append((t * 2 + 1).sum().item())
        if before is None:
            before = compiled_program_count()
    assert compiled_program_count() == before
    assert results == [float(sum(2 * i + 1 for i in range(n))) for n in (3, 17, 40)]
    with pytest.raises(AssertionError, match="symbolic shape"):  # data of a symbolic shape has no fixed size
        base.reshape(8, 8).shrink(((0, v.bind(5)), None)).sum(1).numpy()


def test_debug_output_lines(capsys: pytest.CaptureFixture[str]) -> None:
    a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    with Context(DEBUG=2):
        (a * 3 + 1).realize()
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("***"))
    assert a.device in line and "GFLOPS" in line and "GB/s" in line and "E_4" in line
    assert GlobalCounters.kernel_count > 0 and GlobalCounters.global_mem > 0 and GlobalCounters.time_sum_s >= 0
    assert GlobalCounters.mem_used >= 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("device", ["CPU", "CPU:X86"])
def test_debug_4_prints_the_source_and_7_the_machine_code(capsys: pytest.CaptureFixture[str], device: str) -> None:
    a = Tensor([1.0, 2.0, 3.0], device=device).realize()
    mnemonics = ("vmulss", "vfmadd", "mulss", "vmulps", "mulps")  # the multiply, as machine code
    with Context(DEBUG=4):
        (a * 5 - 2).realize()  # a new kernel: compiled here, so its source is printed
    out = capsys.readouterr().out
    assert "5" in out and not any(w in out for w in mnemonics)
    with Context(DEBUG=7):
        (a * a * 3).realize()  # another kernel, so it is compiled (and printed) here too
    assert any(w in capsys.readouterr().out for w in mnemonics)


def test_errors_leave_tensors_usable() -> None:
    t = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="unknown dtype"):
        t.cast("float17")
    with pytest.raises(RuntimeError, match="can't make a Tensor"):
        Tensor(object())
    with pytest.raises(RuntimeError, match="can't make a Tensor"):
        Tensor([[1, 2], [3]])
    with pytest.raises(RuntimeError, match="concrete dtype"):
        Tensor([1], dtype=dtypes.weakint)
    assert (t * 2).tolist() == [2, 4, 6]


def test_sibling_version_check() -> None:
    from speck.tensor._siblings import check_sibling_versions, too_old

    assert too_old("0.0.9", "0.1") and not too_old("0.1.0", "0.1") and not too_old("1.2", "0.9")
    check_sibling_versions()
    with pytest.raises(ImportError, match=r"needs speck-uop>=99.0, but speck-uop .* is installed.*pip install -U"):
        check_sibling_versions({"speck-uop": "99.0"})


def test_nan_inf_values_roundtrip() -> None:
    v = [math.inf, -math.inf, 0.0, -0.0]
    assert Tensor(v).tolist() == v
    assert math.isnan(Tensor([math.nan]).item())
