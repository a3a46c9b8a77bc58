"""Pickled captured TinyJits (TENSOR_API §11.4, §14): the loaded JIT replays at once with new inputs and gives numpy's
values, whatever the function captured (constant tensors from closures, Python scalars, arange/full, a model's
weights, sharded inputs and outputs); the stream holds plain bytes for buffer contents (no numpy objects: an
unpickler that fakes every class still walks it) and protocol 5 can carry them out of band."""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from speck.tensor import Tensor, TinyJit

RNG = np.random.default_rng(5)


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _captured(f: TinyJit[Any], *make: Any) -> None:
    for _ in range(3):
        f(*[m() for m in make])
    assert f.captured is not None


def test_captured_constants_replay_after_loading() -> None:
    w = arr(4)
    wt = Tensor(w).realize()
    lazy = Tensor([10.0, 20.0, 30.0, 40.0])  # a constant never realized before the capture
    k = 2.5

    @TinyJit
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        y = x * wt + lazy + k + Tensor.arange(4) + Tensor.full((4,), 0.5)
        return y.realize(), (y.exp().sum() * k).realize()

    _captured(f, lambda: Tensor(arr(4)))
    g = pickle.loads(pickle.dumps(f))
    assert g.fxn is None
    for _ in range(3):
        x = arr(4)
        y = x * w + np.array([10, 20, 30, 40], np.float32) + k + np.arange(4) + 0.5
        got_y, got_s = g(Tensor(x))
        np.testing.assert_allclose(got_y.numpy(), y, rtol=1e-6)
        np.testing.assert_allclose(got_s.numpy(), np.exp(y).sum() * k, rtol=1e-5)


def test_unrealized_random_inputs_at_capture_then_loaded() -> None:
    @TinyJit
    def add(a: Tensor, b: Tensor) -> Tensor:
        return a.sum() + b + 1

    _captured(add, lambda: Tensor.rand(10, 10), lambda: Tensor.rand(10, 10))
    loaded = pickle.loads(pickle.dumps(add))
    a, b = arr(10, 10), arr(10, 10)
    np.testing.assert_allclose(loaded(Tensor(a), Tensor(b)).numpy(), a.sum() + b + 1, rtol=1e-5, atol=1e-5)


def test_sharded_inputs_and_outputs_replay_after_loading() -> None:
    """A sharded returned tensor is pickled as its per-device buffers: the loaded JIT replays into it (it used to be
    re-sharded from a copy of its values, which no replay wrote: every call returned the captured value)."""
    devs = ("CPU", "CPU:1")

    @TinyJit
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        return (x * 2).sum().realize(), (x + 1).realize()

    _captured(f, lambda: Tensor(arr(4)).shard(devs, axis=0))
    g = pickle.loads(pickle.dumps(f))
    for _ in range(3):
        x = arr(4)
        s, y = g(Tensor(x).shard(devs, axis=0))
        np.testing.assert_allclose(s.numpy(), (x * 2).sum(), rtol=1e-5)
        np.testing.assert_allclose(y.numpy(), x + 1, rtol=1e-6)
        assert y.device == devs


def test_the_stream_holds_plain_bytes_and_loads_with_faked_classes() -> None:
    @TinyJit
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a.sum() + b + 1).realize()

    _captured(f, lambda: Tensor(arr(20, 20)), lambda: Tensor(arr(20, 20)))
    data = pickle.dumps(f)
    named: list[str] = []

    class Fake:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    class Inspect(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            named.append(f"{module}.{name}")
            return type("Faked", (Fake,), {})

    Inspect(io.BytesIO(data)).load()  # every object a fake one: states must be plain dicts, data plain bytes
    assert not [n for n in named if n.startswith("numpy")], named


def test_protocol_5_carries_buffer_contents_out_of_band() -> None:
    w = arr(1000)
    wt = Tensor(w).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * wt).realize()

    _captured(f, lambda: Tensor(arr(1000)))
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps(f, protocol=5, buffer_callback=bufs.append)
    assert len(pickle.dumps(f, protocol=5)) - len(data) >= 3 * 1000 * 4  # input, weights, output: beside it
    g = pickle.loads(data, buffers=bufs)
    x = arr(1000)
    np.testing.assert_allclose(g(Tensor(x)).numpy(), x * w, rtol=1e-6)
    h = pickle.loads(pickle.dumps(f, protocol=2))  # and in band with an old protocol
    np.testing.assert_allclose(h(Tensor(x)).numpy(), x * w, rtol=1e-6)


def test_symbolic_capture_replays_every_bound_value_after_loading() -> None:
    from speck.tensor import Variable

    w = arr(10)
    wt = Tensor(w).realize()

    @TinyJit
    def f(x: Tensor, n: Any) -> Tensor:
        return (x[:n] * wt[:n]).sum().realize()

    for k in (2, 3):
        f(Tensor(arr(10)), Variable("n", 1, 10).bind(k))
    g = pickle.loads(pickle.dumps(f))
    for k in (1, 7, 10, 4):
        x = arr(10)
        np.testing.assert_allclose(g(Tensor(x), Variable("n", 1, 10).bind(k)).numpy(), (x[:k] * w[:k]).sum(),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
