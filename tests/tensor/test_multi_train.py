"""Training on sharded tensors: gradients through sharding, allreduce and gathers (against numpy), optimizers and
TinyJit replays on sharded parameters and data (against the same steps on one device), and data-parallel
speck-train."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import GlobalCounters, Tensor, TinyJit, nn
from speck.tensor.examples import train
from speck.tensor.multi import MultiUOp
from speck.tensor.nn.optim import SGD, Adam
from speck.tensor.nn.state import get_parameters
from tensor_helpers import FEW

CPU2 = ("CPU", "CPU:1")


def _np(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_replicated_parameter_gets_the_allreduced_gradient() -> None:
    x, w = _np((6, 3)), _np((3, 4), 1)
    W = Tensor(w).shard(CPU2).realize()
    W.requires_grad = True
    loss = (Tensor(x).shard(CPU2, 0) @ W).relu().sum()
    loss.backward()
    assert W.grad is not None and W.grad.device == CPU2 and W.grad.uop.axis is None
    ref = x.T @ ((x @ w) > 0).astype(np.float32)
    np.testing.assert_allclose(W.grad.numpy(), ref, rtol=1e-5, atol=1e-6)
    # both replicas hold the same gradient
    g = W.grad.realize().uop
    assert isinstance(g, MultiUOp)
    np.testing.assert_array_equal(Tensor(g.shards[0]).numpy(), Tensor(g.shards[1], device="CPU:1").numpy())


def test_gradient_flows_back_through_shard_and_gather() -> None:
    x, w = _np((4, 3)), _np((3, 2), 1)
    wt = Tensor(w, requires_grad=True)
    loss = (Tensor(x).shard(CPU2, 0) @ wt.shard(CPU2)).square().sum()
    (gw,) = loss.gradient(wt)
    assert gw.device == "CPU"
    np.testing.assert_allclose(gw.numpy(), x.T @ (2 * (x @ w)), rtol=1e-5, atol=1e-5)
    xt = Tensor(x, requires_grad=True)
    y = (xt.shard(CPU2, 0) * 3).to("CPU:1")  # a gather: the gradient goes back to the shards, then to xt
    (gx,) = (y * y).sum().gradient(xt)
    np.testing.assert_allclose(gx.numpy(), 18 * x, rtol=1e-5)


def test_sharded_parameter_gets_a_sharded_gradient() -> None:
    x, w = _np((4, 3)), _np((3, 6), 1)
    W = Tensor(w).shard(CPU2, 1).realize()
    W.requires_grad = True
    (Tensor(x).shard(CPU2) @ W).sum().backward()
    assert W.grad is not None and W.grad.device == CPU2
    np.testing.assert_allclose(W.grad.numpy(), x.T @ np.ones((4, 6), np.float32), rtol=1e-5)


def _mlp_losses(devices: tuple[str, ...] | None, opt_cls: type, jit: bool, steps: int = 4) -> tuple[list, np.ndarray]:
    """Train a small MLP for `steps` steps (on one device, or data-parallel over `devices`)."""
    Tensor.manual_seed(3)
    l1, l2 = nn.Linear(8, 16), nn.Linear(16, 3)
    params = get_parameters([l1, l2])
    if devices:
        for p in params:
            p.shard_(devices).realize()
    opt = opt_cls(params, lr=0.05)
    x_all, y_all = _np((steps * 8, 8), 5), np.random.default_rng(6).integers(0, 3, steps * 8).astype(np.int32)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step(loss)
        return loss

    fn = TinyJit(step) if jit else step
    losses = []
    for i in range(steps):
        xb, yb = Tensor(x_all[i * 8 : i * 8 + 8]), Tensor(y_all[i * 8 : i * 8 + 8])
        if devices:
            xb, yb = xb.shard(devices, 0), yb.shard(devices, 0)
        losses.append(fn(xb.realize(), yb.realize()).item())
    return losses, l1.weight.numpy()


@pytest.mark.parametrize("opt_cls", [SGD, Adam])
def test_data_parallel_steps_match_one_device(opt_cls: type) -> None:
    ref_loss, ref_w = _mlp_losses(None, opt_cls, jit=False)
    dp_loss, dp_w = _mlp_losses(CPU2, opt_cls, jit=False)
    np.testing.assert_allclose(dp_loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(dp_w, ref_w, rtol=1e-4, atol=1e-6)


def test_tinyjit_replays_a_data_parallel_step() -> None:
    ref_loss, ref_w = _mlp_losses(None, Adam, jit=True, steps=5)
    dp_loss, dp_w = _mlp_losses(CPU2, Adam, jit=True, steps=5)
    np.testing.assert_allclose(dp_loss, ref_loss, rtol=1e-5)  # calls 3..5 are replays
    np.testing.assert_allclose(dp_w, ref_w, rtol=1e-4, atol=1e-6)


def test_tinyjit_replay_runs_the_captured_copies() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2).sum(0)

    rng = np.random.default_rng(0)
    for i in range(4):
        a = rng.standard_normal((4, 3)).astype(np.float32)
        x = Tensor(a).shard(CPU2, 0).realize()  # shard 0 is a clone of its piece of the CPU buffer, not a view
        GlobalCounters.reset()
        out = f(x)
        if i >= 2:  # replays: two partial sums, one copy each way, two additions
            assert GlobalCounters.copy_count == 2 and GlobalCounters.kernel_count == 6
        x = Tensor(a).shard(CPU2, 0).clone().realize()  # whole buffers on both devices
        GlobalCounters.reset()
        out = f(x)
        if i >= 2:
            assert GlobalCounters.copy_count == 2 and GlobalCounters.kernel_count == 6
        np.testing.assert_allclose(out.numpy(), (a * 2).sum(0), rtol=1e-6)


def test_batchnorm_conv_step_matches_one_device() -> None:
    """One SGD step of a conv + batch-norm model: the sharded batch's statistics are allreduced, so the update is
    the one-device update."""

    def run(devices: tuple[str, ...] | None) -> list[np.ndarray]:
        Tensor.manual_seed(1)
        conv, bn = nn.Conv2d(1, 4, 3), nn.BatchNorm(4)
        params = get_parameters([conv, bn])
        if devices:
            for p in params:
                p.shard_(devices).realize()
        opt = SGD(params, lr=0.1)
        x = Tensor(_np((4, 1, 6, 6), 2))
        if devices:
            x = x.shard(devices, 0)
        with Tensor.train():
            opt.zero_grad()
            loss = bn(conv(x)).relu().max_pool2d().sum()
            loss.backward()
            opt.step()
        return [p.numpy() for p in params]

    for got, ref in zip(run(CPU2), run(None)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_assign_to_sharded_tensors() -> None:
    a = _np((4, 2))
    t = Tensor(a).shard(CPU2, 0).realize()
    t.assign(t * 2).realize()
    np.testing.assert_allclose(t.numpy(), a * 2)
    t.assign(Tensor(a))  # a value on one device is placed like the target
    np.testing.assert_allclose(t.numpy(), a)
    with pytest.raises(RuntimeError, match="axis"):
        t.assign(Tensor(a).shard(CPU2, 1))
    r = Tensor(a).shard(CPU2).realize()
    r += 1
    np.testing.assert_allclose(r.numpy(), a + 1)


def test_speck_train_data_parallel_matches_one_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = ["--model", "mlp", "--steps", "40", "--batch", "64", "--train-subset", "2000", "--test-subset", "500",
            "--quiet", "--out", ""]  # fmt: skip
    one = train.main(args)
    two = train.main([*args, "--devices", "2"])
    assert two > 0.6 and abs(two - one) <= 0.02, (one, two)


@FEW
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(0, 5), st.booleans()), min_size=1,
                max_size=24))  # fmt: skip
def test_replay_order_groups_devices_and_keeps_every_dependency(spec: list[tuple[int, int, int, bool]]) -> None:
    """The runner's device_runs on random copies between buffers on three devices: the same calls, every conflicting
    pair (read after write, write after read or write) still in order, and no more device switches than before."""
    from speck.hcq import Buffer
    from speck.hcq.runner import Copy, device_runs, reads_writes

    devs = ("NULL", "NULL:1", "NULL:2")
    slot = {(d, k): i for i, (d, k) in enumerate((d, k) for d in devs for k in range(6))}
    bufs = [Buffer(d, 4, np.float32) for d, _ in slot]
    calls = []
    for dev, dst, src, cross in spec:
        d, s = devs[dev], devs[(dev + 1) % 3] if cross else devs[dev]
        calls.append(Copy(slot[(d, dst)], slot[(s, src)], 0, 16))
    out = device_runs(calls, bufs)
    assert sorted(map(id, out)) == sorted(map(id, calls))
    pos = {id(c): i for i, c in enumerate(out)}
    acc = [tuple(map(set, reads_writes(c))) for c in calls]
    for i in range(len(calls)):
        for j in range(i + 1, len(calls)):
            (ri, wi), (rj, wj) = acc[i], acc[j]
            if wi & (rj | wj) or ri & wj:
                assert pos[id(calls[i])] < pos[id(calls[j])]

    def switches(cs: list) -> int:  # type: ignore[type-arg]
        ds = [bufs[c.dst].device for c in cs]
        return sum(a != b for a, b in zip(ds, ds[1:]))

    assert switches(out) <= switches(calls)


def test_backward_of_a_sharded_graph_sharing_a_constant_with_a_one_device_graph() -> None:
    """Graph nodes are interned: the broadcast constant of `x * 1.0` is one node in a sharded model's graph and in a
    one-device model's graph, and gets a gradient contribution from each when a tensor of one graph is still alive:
    the sharded one is gathered to its device (it raised "all buffers must be on the same device" in the second
    step). Both models train as they would alone."""
    devs = ("CPU", "CPU:1")
    em, er = Tensor.randn(10, 8).realize(), Tensor.randn(10, 8).realize()
    em0, er0 = em.clone().realize(), er.clone().realize()
    em.shard_(devs)
    head_m = Tensor.randn(8, 10).contiguous().shard(devs)  # pending: computed on each device
    head_r = Tensor.randn(8, 10).realize()
    hm0 = head_m.to("CPU").clone().realize()
    for _ in range(2):
        lm = ((em * 1.0)[:3] @ head_m).sum()
        lm.backward()
        em.assign(em - 0.01 * em.grad).realize()
        em.grad = None
        lr = ((er * 1.0)[:3] @ head_r).sum()
        lr.backward()
        er.assign(er - 0.01 * er.grad).realize()
        er.grad = None
    for got, start, h in ((em, em0, hm0), (er, er0, head_r)):
        step = np.zeros((10, 8), np.float32)
        step[:3] = h.numpy().sum(1)
        np.testing.assert_allclose(got.numpy(), start.numpy() - 0.02 * step, atol=1e-5)


def test_backward_when_a_previous_loss_gradient_is_a_constant_of_the_sharded_graph() -> None:
    """A one-device loss keeps its .grad (the seed, the interned constant 1.0) while a sharded model's loss goes
    backward, and that constant is a node of the sharded graph too: the live seed tensor gets a sharded gradient,
    which must land on its own device (the next one-device backward raised 'all buffers must be on the same
    device'). Both models still train as they would alone."""
    devs = ("CPU", "CPU:1")
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    y = np.array([0, 2, 1, 2], np.int32)
    w0 = np.random.default_rng(1).standard_normal((3, 6)).astype(np.float32)
    ws, wu = Tensor(w0).realize().shard_(devs, axis=None), Tensor(w0.copy()).realize()
    xs, ys, xu, yu = Tensor(x).shard(devs, axis=0), Tensor(y).shard(devs, axis=0), Tensor(x), Tensor(y)
    losses = []
    for _ in range(2):
        ls = (xs @ ws.T).sparse_categorical_crossentropy(ys).backward()
        lu = (xu @ wu.T).sparse_categorical_crossentropy(yu).backward()
        assert lu.grad is not None and lu.grad.device == "CPU"
        for w in (ws, wu):
            assert w.grad is not None
            w.assign(w - 0.5 * w.grad).realize()
            w.grad = None
        losses.append((ls.item(), lu.item()))
    np.testing.assert_allclose(ws.numpy(), wu.numpy(), atol=1e-6)
    for a, b in losses:
        assert abs(a - b) < 1e-6


def test_assign_to_an_unrealized_sharded_tensor_is_lazy() -> None:
    """An unrealized sharded target takes the value as a graph, as a one-device one does: no kernel runs at the
    assign (it ran a schedule of its own, so backward()'s `x.grad += g` into a sharded input's .grad recomputed the
    whole forward and backward pass every step), and the value is the one of the assign's time."""
    a, b0 = _np((4, 3)), _np((4, 3), 1)
    b = Tensor(b0).shard(CPU2, 0).realize()
    t = Tensor(a).shard(CPU2, 0) * 2  # unrealized
    GlobalCounters.reset()
    t.assign(t + b)
    assert GlobalCounters.kernel_count == 0
    b.assign(Tensor(np.zeros((4, 3), np.float32)).shard(CPU2, 0)).realize()  # a later write t must not see
    np.testing.assert_allclose(t.numpy(), a * 2 + b0, rtol=1e-6)
    np.testing.assert_array_equal(b.numpy(), np.zeros((4, 3), np.float32))


def _conv_bn_losses(devices: tuple[str, ...] | None, steps: int) -> tuple[list[float], list[np.ndarray], list[int]]:
    """A jitted Adam step of a conv + batch-norm + linear model on batches of 8 images (data-parallel over `devices`,
    or on one device), the first batch in the first two calls (a training loop over batches kept in memory: the
    capture then meets an input whose .grad the first call set): the losses, the final parameters and the kernels
    each call ran. (The conv has no bias: batch norm takes its mean away, so its gradient is rounding noise, which
    Adam scales up to whole steps that differ between one and two devices.)"""
    Tensor.manual_seed(2)
    conv, bn, fc = nn.Conv2d(1, 4, 3, bias=False), nn.BatchNorm(4), nn.Linear(4 * 3 * 3, 3)
    params = get_parameters([conv, bn, fc])
    if devices:
        for p in params:
            p.shard_(devices).realize()
    opt = Adam(params, lr=0.01)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = fc(bn(conv(x)).relu().max_pool2d().flatten(1)).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step(loss)
        return loss

    rng = np.random.default_rng(7)
    batches = []
    for i in range(3):
        x, y = Tensor(_np((8, 1, 8, 8), 10 + i)), Tensor(rng.integers(0, 3, 8).astype(np.int32))
        if devices:
            x, y = x.shard(devices, 0), y.shard(devices, 0)
        batches.append((x.realize(), y.realize()))
    losses, kernels = [], []
    for i in range(steps):
        x, y = batches[max(0, i - 1) % 3]
        GlobalCounters.reset()
        losses.append(step(x, y).item())
        kernels.append(GlobalCounters.kernel_count)
    return losses, [p.numpy() for p in params], kernels


def test_jitted_conv_batchnorm_step_data_parallel_matches_one_device() -> None:
    """bench/multidevice.py's data-parallel row in small: the losses and parameters of jitted Adam steps over
    CPU,CPU:1 are the one-device ones, and every call (the plain first one, the capture, the replays) runs the same
    kernels: the capture does not compute the step twice."""
    ref_loss, ref_params, ref_kernels = _conv_bn_losses(None, 5)
    dp_loss, dp_params, dp_kernels = _conv_bn_losses(CPU2, 5)
    np.testing.assert_allclose(dp_loss, ref_loss, rtol=1e-4, atol=1e-6)
    for got, ref in zip(dp_params, ref_params):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-5)
    assert len(set(ref_kernels)) == 1, ref_kernels
    assert len(set(dp_kernels)) == 1, dp_kernels
