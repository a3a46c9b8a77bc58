"""tinygrad-parity probes (round 8): names and keywords tinygrad code calls that speck lacked (TinyJit's `optimize=`,
`Tensor.kernelize`, the older `leakyrelu`/`pad2d`), and ops whose operands sit on two devices, which failed late in
the runtime (hcq's ProgramArgumentError at program launch) instead of with a tensor error naming both devices.
Values are checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, TinyJit, dtypes
from speck.tensor.errors import TensorError

DEVS = ("CPU", "CPU:1")


# ---------------- TinyJit(fn, optimize=...) ----------------
@pytest.mark.parametrize("form", ["call", "decorator"])
def test_tinyjit_accepts_optimize_and_replays_correct_values(form: str) -> None:
    def step(x: Tensor) -> Tensor:
        return (x * 2 + 1).realize()

    jit = TinyJit(step, optimize=True) if form == "call" else TinyJit(optimize=True)(step)
    assert jit.optimize is True
    rng = np.random.default_rng(0)
    for _ in range(4):
        a = rng.standard_normal(5).astype(np.float32)
        np.testing.assert_allclose(jit(Tensor(a).realize()).numpy(), a * 2 + 1, rtol=1e-6)
    assert jit.captured is not None


def test_tinyjit_optimize_with_prune_keeps_prune() -> None:
    w = Tensor([2.0, 3.0]).contiguous().realize()

    @TinyJit(prune=True, optimize=True)
    def f(x: Tensor) -> Tensor:
        return (x * (w + 1)).realize()

    for i in range(4):
        out = f(Tensor([float(i), 1.0]).contiguous().realize())
    assert f.prune is True and out.tolist() == [3.0 * 3, 4.0]


@pytest.mark.parametrize("kw", ["optimize", "prune"])
def test_tinyjit_flags_must_be_bools(kw: str) -> None:
    with pytest.raises(TypeError, match=kw):
        TinyJit(lambda x: x, **{kw: "yes"})


# ---------------- Tensor.kernelize ----------------
def test_kernelize_returns_self_and_keeps_values() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor(a) * 3 - 1
    assert t.kernelize() is t
    u = Tensor(a).sum(axis=1)
    assert Tensor.kernelize(t, u) is t  # the class-level form with several tensors
    np.testing.assert_allclose(t.numpy(), a * 3 - 1)
    np.testing.assert_allclose(u.numpy(), a.sum(axis=1))
    assert len((Tensor(a).realize() + 1).kernelize().schedule()) == 1


def test_kernelize_rejects_non_tensors() -> None:
    with pytest.raises(TypeError, match="kernelize"):
        Tensor([1.0]).kernelize(3)  # type: ignore[arg-type]


# ---------------- older tinygrad names ----------------
def test_leakyrelu_is_leaky_relu() -> None:
    a = np.linspace(-3, 3, 13, dtype=np.float32)
    np.testing.assert_allclose(Tensor(a).leakyrelu().numpy(), np.where(a > 0, a, a * 0.01), rtol=1e-6)
    np.testing.assert_allclose(Tensor(a).leakyrelu(0.2).numpy(), np.where(a > 0, a, a * 0.2), rtol=1e-6)


@pytest.mark.parametrize("padding", [(1, 2), (1, 0, 0, 2), (0, 1, 2, 0, 1, 1)])
def test_pad2d_pads_the_last_dims_torch_order(padding: tuple[int, ...]) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    pairs = [(0, 0)] * 3
    for i in range(len(padding) // 2):
        pairs[-1 - i] = (padding[2 * i], padding[2 * i + 1])
    np.testing.assert_array_equal(Tensor(a).pad2d(padding, value=-1.0).numpy(), np.pad(a, pairs, constant_values=-1))


def test_pad2d_refuses_per_dim_pairs() -> None:
    with pytest.raises(ValueError, match="pad2d"):
        Tensor.ones(2, 2).pad2d(((1, 1), (0, 0)))


# ---------------- operands on two devices ----------------
def _pair() -> tuple[Tensor, Tensor]:
    return Tensor.ones(4, device=DEVS[0]).contiguous().realize(), Tensor.ones(4, device=DEVS[1]).contiguous().realize()


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,  # one shape and dtype
        lambda a, b: a * b[None],  # broadcast
        lambda a, b: a + b.half(),  # promoted
        lambda a, b: a.cat(b),
        lambda a, b: a.reshape(2, 2) @ b.reshape(2, 2),
        lambda a, b: (a > 0).where(b, 0),
        lambda a, b: Tensor.ones(4, device=DEVS[0]) - b,  # a constant on one device, a buffer on the other
        lambda a, b: Tensor.rand(4, device=DEVS[0]) + Tensor.rand(4, device=DEVS[1]),
    ],
)
def test_op_on_two_devices_is_a_tensor_error_naming_both(op) -> None:  # type: ignore[no-untyped-def]
    a, b = _pair()
    with pytest.raises(RuntimeError, match=r"two devices") as e:
        op(a, b).realize()
    assert isinstance(e.value, TensorError)
    assert "CPU:1" in str(e.value) and ".to(" in str(e.value)


def test_op_after_moving_to_one_device_computes() -> None:
    a, b = _pair()
    np.testing.assert_array_equal((a + b.to(DEVS[0])).numpy(), np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal((a.to(DEVS[1]) * b[None]).numpy(), np.ones((1, 4), np.float32))
    assert (a + Tensor(2.0)).tolist() == [3.0] * 4  # a device-less operand takes the other's device


# ---------------- computing on DISK ----------------
def test_computing_on_a_disk_tensor_is_an_assertion_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fn = tmp_path / "w.bin"
    fn.write_bytes(bytes([1, 2, 3, 4]))
    t = Tensor(fn)
    with pytest.raises(AssertionError, match=r"DISK.*\.to\('CPU'\)") as e:
        (t + 1).realize()
    assert isinstance(e.value, TensorError)
    # moved first, it computes; views and copies of DISK data stay fine
    assert (t.to("CPU") + 1).tolist() == [2, 3, 4, 5] and t[1:3].to("CPU").tolist() == [2, 3]


# ---------------- numpy arrays of a dtype no tensor has ----------------
@pytest.mark.parametrize("arr", [np.array([1j]), np.array(["a"]), np.array([None], dtype=object)])
def test_unsupported_numpy_dtype_is_a_key_error_and_a_type_error(arr: object) -> None:
    with pytest.raises(KeyError, match="not supported") as e:  # tinygrad's dtype lookup raises KeyError
        Tensor(arr)
    assert isinstance(e.value, TypeError) and isinstance(e.value, TensorError)
    assert str(e.value).startswith("numpy dtype")  # the message itself, not KeyError's repr of it


# ---------------- safe_save of a dtype safetensors can't name ----------------
@pytest.mark.parametrize("dt", ["fp8e4m3fnuz", "fp8e5m2fnuz"])
def test_safe_save_of_an_unnamed_dtype_is_a_key_error(tmp_path, dt: str) -> None:  # type: ignore[no-untyped-def]
    from speck.tensor.nn.state import safe_load, safe_save

    with pytest.raises(KeyError, match=f"{dt}.*no safetensors name") as e:
        safe_save({"a": Tensor([1.0], dtype=getattr(dtypes, dt))}, tmp_path / "x.safetensors")
    assert isinstance(e.value, ValueError)  # still the loaders' CheckpointError (a ValueError)
    safe_save({"a": Tensor([1.5, -2.0], dtype=dtypes.fp8e4m3)}, tmp_path / "y.safetensors")  # a named fp8 saves
    assert safe_load(tmp_path / "y.safetensors")["a"].to("CPU").tolist() == [1.5, -2.0]


def test_a_disk_operand_next_to_a_compute_tensor_is_an_assertion_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fn = tmp_path / "d.bin"
    fn.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    d = Tensor(fn).bitcast(dtypes.float32)
    c = Tensor.ones(4).contiguous().realize()
    for op in (lambda: c + d, lambda: d * c[None], lambda: (c > 0).where(d, 0.0)):
        with pytest.raises(AssertionError, match="DISK"):
            op().realize()
    np.testing.assert_array_equal((c + d.to("CPU")).numpy(), np.arange(4, dtype=np.float32) + 1)


# ---------------- t.lazydata (tinygrad's older name for t.uop) ----------------
def test_lazydata_reads_and_writes_the_graph_node() -> None:
    t = Tensor([1.0, 2.0]) * 3
    assert t.lazydata is t.uop
    u = Tensor([5.0, 6.0]).realize()
    t.lazydata = u.lazydata  # older model code swapped nodes this way
    assert t.uop is u.uop and t.tolist() == [5.0, 6.0]


@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a.cat(b),
        lambda a, b: Tensor.stack(a, b, dim=1),
        lambda a, b: b * a[None],
        lambda a, b: a @ b,
        lambda a, b: a.reshape(2, 2).matmul(b.reshape(2, 2), reverse=True),
    ],
)
def test_two_device_ops_raise_where_they_are_built(op) -> None:  # type: ignore[no-untyped-def]
    a, b = _pair()
    with pytest.raises(RuntimeError, match=r"two devices, CPU(:1)? and CPU(:1)?"):
        op(a, b)  # no realize: the line that mixes the devices is the one that fails
    # a device-less operand joins either device
    np.testing.assert_array_equal(a.cat(Tensor.arange(2).float()).numpy(), np.array([1, 1, 1, 1, 0, 1], np.float32))


# each op on Tensors and the numpy reference of the same op
_OPS = {
    "add": (lambda a, b: a + b, lambda p, q: p + q),
    "mul": (lambda a, b: a * b, lambda p, q: p * q),
    "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "lt": (lambda a, b: a < b, lambda p, q: p < q),
    "where": (lambda a, b: (a > 0).where(a, b), lambda p, q: np.where(p > 0, p, q)),
    "cat": (lambda a, b: a.cat(b, dim=-1), lambda p, q: np.concatenate([p, q], -1)),
}
_SHAPES = st.sampled_from([(3,), (2, 3), (1, 3)])


@given(st.sampled_from(sorted(_OPS)), _SHAPES, _SHAPES, st.sampled_from(["float32", "int32", "float16"]), st.booleans())
def test_any_op_mixing_two_devices_fails_with_the_tensor_error(
    op: str, sa: tuple[int, ...], sb: tuple[int, ...], dt: str, swap: bool
) -> None:
    """Whichever path builds the op (the same-shape hot path, promotion, broadcasting, cat), realized operands on two
    devices end in the two-devices TensorError (at the op or at its realize), never hcq's launch error or a value;
    on one device the same op computes numpy's value."""
    if op == "cat" and sa[:-1] != sb[:-1]:
        return
    rng = np.random.default_rng(0)
    x, y = rng.integers(-3, 4, sa).astype(dt), rng.integers(-3, 4, sb).astype(dt)
    if swap:
        x, y = y, x
    fn, ref = _OPS[op]
    a, b = Tensor(x, device=DEVS[int(swap)]).realize(), Tensor(y, device=DEVS[1 - int(swap)]).realize()
    with pytest.raises(RuntimeError, match="two devices") as e:
        fn(a, b).realize()
    assert isinstance(e.value, TensorError)
    np.testing.assert_array_equal(fn(a, b.to(a.device)).numpy(), ref(x, y))
