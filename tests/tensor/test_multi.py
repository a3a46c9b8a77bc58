"""Tensors sharded over several devices (speck.tensor.multi, speck.tensor.allreduce): placement, every op kind
against numpy, the allreduce algorithms' exact copy and kernel counts, and copies through the HCQ copy engines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.hcq import Device, runner
from speck.tensor import Context, GlobalCounters, KernelCountException, Tensor, assert_kernel_count, dtypes, nn
from speck.tensor.allreduce import choose_algorithm
from speck.tensor.multi import MultiUOp
from speck.tensor.nn.state import get_parameters
from tensor_helpers import FEW

CPU2 = ("CPU", "CPU:1")
CPU4 = ("CPU", "CPU:1", "CPU:2", "CPU:3")


def _np(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _sharded(a: np.ndarray, devices: tuple[str, ...], axis: int | None) -> Tensor:
    return Tensor(a).shard(devices, axis).realize()


class CopySpy:
    """Records (source device, destination device) of every device-to-device copy the realize engine runs."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, str]] = []
        self.nbytes: list[int] = []

    def __enter__(self) -> CopySpy:
        self.orig = runner._Run.copy

        def spy(run: runner._Run, c: runner.Copy) -> None:
            src, dst = run.bufs[c.src].device, run.bufs[c.dst].device
            if src != dst:
                self.pairs.append((src, dst))
                self.nbytes.append(c.nbytes)
            self.orig(run, c)

        runner._Run.copy = spy  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        runner._Run.copy = self.orig  # type: ignore[method-assign]


# ---------------- placement ----------------
def test_shard_places_pieces_and_reports_devices() -> None:
    a = _np((4, 6))
    t = Tensor(a).shard(("cpu:0", "cpu:1"), axis=1)
    assert t.device == CPU2 and t.shape == (4, 6) and t.uop.axis == 1
    assert isinstance(t.uop, MultiUOp) and [s.shape for s in t.uop.shards] == [(4, 3), (4, 3)]
    np.testing.assert_array_equal(t.numpy(), a)
    r = Tensor(a).shard(CPU2)
    assert r.uop.axis is None and [s.shape for s in r.uop.shards] == [(4, 6), (4, 6)]
    np.testing.assert_array_equal(r.numpy(), a)
    n = Tensor(a).shard(CPU2, axis=-2)
    assert n.uop.axis == 0


def test_shard_errors_name_the_problem() -> None:
    with pytest.raises(RuntimeError, match=r"uneven.*axis 0.*size 5.*2 devices"):
        Tensor(_np((5, 2))).shard(CPU2, 0)
    t = Tensor(_np((4, 2))).shard(CPU2, 0)
    with pytest.raises(RuntimeError, match="already sharded"):
        t.shard(CPU2, 1)
    with pytest.raises(RuntimeError, match="tuple of devices"):
        Tensor(_np((4,))).shard("CPU:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="several devices"):
        Tensor.rand(4, device=CPU2)


def test_one_device_tuple_is_to_and_shard_in_place() -> None:
    a = _np((2, 2))
    t = Tensor(a).shard(("CPU:1",))
    assert t.device == "CPU:1" and not isinstance(t.uop, MultiUOp)
    u = Tensor(a)
    assert u.shard_(CPU2, 0) is u and u.device == CPU2 and u.uop.axis == 0
    np.testing.assert_array_equal(u.numpy(), a)


def test_to_replicates_and_gathers() -> None:
    a = _np((4, 3))
    r = Tensor(a).to(CPU2)
    assert r.device == CPU2 and r.uop.axis is None
    g = Tensor(a).shard(CPU2, 0).to("CPU:1")
    assert g.device == "CPU:1"
    np.testing.assert_array_equal(g.numpy(), a)
    np.testing.assert_array_equal(Tensor(a, device=CPU2).numpy(), a)
    z = Tensor.zeros(3, 2, device=CPU2)
    assert z.device == CPU2 and z.numpy().shape == (3, 2) and not z.numpy().any()


def test_shard_like_and_likes_follow_the_sharding() -> None:
    a = _np((4, 2))
    s = Tensor(a).shard(CPU2, 0)
    y = Tensor(_np((4, 2), 1)).shard_like(s)
    assert y.device == CPU2 and y.uop.axis == 0
    assert Tensor(a).shard_like(Tensor(a, device="CPU:1")).device == "CPU:1"
    o = s.ones_like()
    assert o.uop.axis == 0 and o.numpy().sum() == 8
    with pytest.raises(RuntimeError, match="device="):
        s.zeros_like(device="CPU")
    e = s.rand_like()
    assert e.uop.axis == 0 and e.shape == (4, 2)
    v = e.numpy()
    assert ((v >= 0) & (v < 1)).all() and not np.array_equal(v[:2], v[2:])  # independent draws per device


# ---------------- elementwise and movement ----------------
@FEW
@given(seed=st.integers(0, 2**16), axis=st.sampled_from([0, 1, None]))
def test_elementwise_matches_numpy(seed: int, axis: int | None) -> None:
    a, b = _np((4, 6), seed), _np((4, 6), seed + 1)
    x, y = _sharded(a, CPU2, axis), _sharded(b, CPU2, axis)
    out = ((x * y + 2.0).exp2() - (x < y).where(x, 1.5)).relu()
    assert out.device == CPU2 and out.uop.axis == axis
    ref = np.maximum(np.exp2(a * b + 2.0) - np.where(a < b, a, 1.5), 0)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5)


def test_replicated_operand_is_cut_without_copies() -> None:
    a, b = _np((4, 6)), _np((6,), 1)
    x, bias = _sharded(a, CPU2, 0), _sharded(b, CPU2, None)
    GlobalCounters.reset()
    out = (x + bias).realize()
    assert GlobalCounters.copy_count == 0 and out.uop.axis == 0
    np.testing.assert_allclose(out.numpy(), a + b)


def test_different_axes_reshard_to_the_last_operand() -> None:
    a, b = _np((4, 6)), _np((4, 6), 1)
    x, y = _sharded(a, CPU4[:2], 0), _sharded(b, CPU4[:2], 1)
    GlobalCounters.reset()
    out = (x + y).realize()
    assert out.uop.axis == 1 and GlobalCounters.copy_count == 2 * 1
    np.testing.assert_allclose(out.numpy(), a + b)


def test_mixing_devices_is_an_error() -> None:
    x = Tensor(_np((4, 2))).shard(CPU2, 0)
    with pytest.raises(RuntimeError, match="all buffers must be on the same device"):
        (x + Tensor(_np((4, 2)))).realize()
    with pytest.raises(AssertionError, match="different devices"):
        x + Tensor(_np((4, 2))).shard(("CPU:2", "CPU:3"), 0)
    assert (x * Tensor(2.0)).device == CPU2  # a constant goes anywhere


def test_movement_ops_keep_or_move_the_shard_axis() -> None:
    a = _np((4, 6, 2))
    x = _sharded(a, CPU2, 1)
    cases = [
        (x.permute(2, 0, 1), a.transpose(2, 0, 1), 2),
        (x.reshape(4, 2, 3, 2), a.reshape(4, 2, 3, 2), 1),
        (x.reshape(4, 12), a.reshape(4, 12), 1),
        (x.pad(((1, 0), (0, 0), (0, 2))), np.pad(a, ((1, 0), (0, 0), (0, 2))), 1),
        (x[1:3, :, ::-1], a[1:3, :, ::-1], 1),
        (x.unsqueeze(0).expand(3, 4, 6, 2), np.broadcast_to(a[None], (3, 4, 6, 2)), 2),
        (x.sum(2), a.sum(2), 1),
        (x.max(0), a.max(0), 0),
    ]
    for t, ref, axis in cases:
        assert t.uop.axis == axis, (t.shape, t.uop.axis)
        np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6)


def test_movement_across_the_shard_axis() -> None:
    a = _np((4, 6))
    x = _sharded(a, CPU2, 1)
    one = x[:, 3:6]  # exactly device 1's shard: an ordinary tensor there
    assert one.device == "CPU:1" and not isinstance(one.uop, MultiUOp)
    np.testing.assert_array_equal(one.numpy(), a[:, 3:])
    with pytest.raises(RuntimeError, match="moved items between shards"):
        x.reshape(6, 4)
    with pytest.raises(AssertionError, match="pad the sharded axis"):
        x.pad(((0, 0), (1, 1)))
    with pytest.raises(RuntimeError, match="shrink the sharded axis"):
        x[:, 1:4]
    with pytest.raises(RuntimeError, match="flip the sharded axis"):
        x.flip(1)
    with pytest.raises(RuntimeError):
        x.cat(x, dim=1)


# ---------------- reductions and allreduce ----------------
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize(("ring", "all2all", "algo"), [(0, 0, "naive"), (2, 0, "ring"), (0, 2, "all2all")])
def test_allreduce_copy_counts_and_pairs(n: int, ring: int, all2all: int, algo: str) -> None:
    devs = ("NULL", *(f"NULL:{i}" for i in range(1, n)))
    x = Tensor.empty(2 * n, 1000, device="NULL").shard(devs, 0).realize()
    with Context(RING=ring, ALL2ALL=all2all):
        assert choose_algorithm(n, 1000) == algo
        GlobalCounters.reset()
        with CopySpy() as spy:
            out = x.sum(0).realize()
    copies = n * (n - 1) * (1 if algo == "naive" else 2)
    pairs = n if algo == "ring" else n * (n - 1)
    assert GlobalCounters.copy_count == len(spy.pairs) == copies
    assert len(set(spy.pairs)) == pairs
    if algo == "ring":
        assert set(spy.pairs) == {(devs[i], devs[(i + 1) % n]) for i in range(n)}
    assert out.device == devs and out.uop.axis is None


@pytest.mark.parametrize("algo", ["naive", "ring", "all2all"])
def test_allreduce_values_match_numpy(algo: str) -> None:
    a = _np((4, 7, 5))  # 35 elements per device: chunks of 8 and 9
    x = _sharded(a, CPU4, 0)
    with Context(RING=2 if algo == "ring" else 0, ALL2ALL=2 if algo == "all2all" else 0):
        s = x.sum(0).realize()
        m = x.max(0).realize()
    np.testing.assert_allclose(s.numpy(), a.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m.numpy(), a.max(0))
    # every device holds the whole, identical result
    for shard, dev in zip(s.uop.shards, s.uop.device):
        np.testing.assert_array_equal(Tensor(shard, device=dev).numpy(), s.numpy())


def test_algorithm_selection_follows_the_settings() -> None:
    big, small = 256001, 256000
    with Context(RING=1, ALL2ALL=0):
        assert choose_algorithm(2, big) == "naive" and choose_algorithm(3, big) == "ring"
        assert choose_algorithm(3, small) == "naive"
    with Context(RING=0, ALL2ALL=1):
        assert choose_algorithm(3, big) == "all2all" and choose_algorithm(3, small) == "naive"
    with Context(RING=2, ALL2ALL=0):
        assert choose_algorithm(2, 10) == "ring" and choose_algorithm(4, 3) == "naive"  # fewer elements than devices
    with Context(RING=1, RING_ALLREDUCE_THRESHOLD=10):
        assert choose_algorithm(3, 11) == "ring"


@pytest.mark.parametrize("ring", [0, 2])
def test_allreduce_cast_sends_half_values(ring: int) -> None:
    a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float16)
    x = _sharded(a, CPU4[:3], 0)
    for cast, itemsize in ((0, 4), (1, 2)):
        with Context(ALLREDUCE_CAST=cast, RING=ring), CopySpy() as spy:
            s = x.sum(0).realize()  # summed in float32, the result cast back to half
        assert s.dtype == dtypes.float16 and set(spy.nbytes) <= {itemsize * k for k in (2, 3, 8)}, spy.nbytes
        np.testing.assert_allclose(s.numpy().astype(np.float32), a.astype(np.float32).sum(0), rtol=2e-3, atol=2e-3)
        replicas = [Tensor(sh, device=d).numpy() for sh, d in zip(s.uop.shards, s.uop.device)]
        assert all(np.array_equal(r, replicas[0]) for r in replicas)


def test_kernel_count_includes_copies() -> None:
    x = _sharded(_np((4, 8)), CPU2, 0)
    # two partial sums, two copies, two additions
    with Context(RING=0), assert_kernel_count(6):
        x.sum(0).realize()
    with pytest.raises(KernelCountException) as e, assert_kernel_count(4):
        x.sum(0).realize()
    assert e.value.got == 6
    # reductions along an unsharded axis copy nothing
    GlobalCounters.reset()
    with assert_kernel_count(2):
        x.sum(1).realize()
    assert GlobalCounters.copy_count == 0


def test_mean_and_full_reduction() -> None:
    a = _np((6, 4))
    x = _sharded(a, ("CPU", "CPU:1", "CPU:2"), 0)
    np.testing.assert_allclose(x.mean().numpy(), a.mean(), rtol=1e-5)
    np.testing.assert_allclose(x.sum().numpy(), a.sum(), rtol=1e-5)
    np.testing.assert_allclose(x.std(0).numpy(), a.std(0, ddof=1), rtol=1e-4)


@pytest.mark.parametrize(("xa", "wa"), [(0, None), (None, 1), (1, 0), (0, 1)])
def test_matmul_with_either_operand_sharded(xa: int | None, wa: int | None) -> None:
    x, w = _np((4, 6)), _np((6, 8), 1)
    out = _sharded(x, CPU2, xa) @ _sharded(w, CPU2, wa)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5)


def test_python_devices_compute_the_same() -> None:
    a = _np((2, 3))
    x = _sharded(a, ("PYTHON", "PYTHON:1"), 0)
    np.testing.assert_allclose((x * 2).sum(0).numpy(), (a * 2).sum(0), rtol=1e-6)


# ---------------- copies through the HCQ copy engines ----------------
def test_copies_run_on_the_destination_copy_engine() -> None:
    a = _np((2, 1 << 16))
    x = _sharded(a, CPU2, 0)
    engine = Device["CPU:1"].engines["copy"]
    before = engine.submitted
    out = x.sum(0).realize()
    assert engine.submitted == before + 1  # CPU -> CPU:1 went through CPU:1's copy queue
    assert engine.idle  # the schedule ended with its copies complete
    np.testing.assert_allclose(out.numpy(), a.sum(0), rtol=1e-6)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_kernel_count_all_gather_copies_in_place(n: int) -> None:
    # each device's partial sum of its rows (one kernel), then reduce-scatter: one add kernel per received chunk;
    # all-gather: copies straight into the result's regions, no kernel (kernel_count counts the copies too)
    devs = ("NULL", *(f"NULL:{i}" for i in range(1, n)))
    x = Tensor.empty(2 * n, 1000, device="NULL").shard(devs, 0).realize()
    with Context(RING=2, ALL2ALL=0), assert_kernel_count(n + n * (n - 1) + 2 * n * (n - 1)):
        x.sum(0).realize()


def test_copy_waits_for_its_source_not_for_other_copies_into_the_source_device() -> None:
    # a ring step has every device receive while it sends: a copy out of CPU:2 must not wait for CPU:2's copy
    # engine (blocked here on a gate) unless a copy into the memory it reads is in flight there
    import threading

    from speck.hcq.signal import Signal

    a = _np((64,))
    src = Tensor(a, device="CPU:2").realize()
    gate, dev = Signal(0, name="gate"), Device["CPU:2"]
    dev.hw_queue("copy").wait(gate, 1).submit(dev, background=True)
    release = threading.Timer(60.0, gate.set, (1,))  # (only so that a wrong implementation fails instead of hanging)
    release.start()
    try:
        got = src.to("CPU:3").numpy()
        assert gate.value == 0, "the copy waited for an unrelated copy on its source device's copy engine"
    finally:
        release.cancel()
        gate.set(1)
        dev.synchronize()
    np.testing.assert_array_equal(got, a)


def test_kernel_reading_a_region_waits_for_the_copy_into_its_base() -> None:
    # in-flight copies are matched by the memory they write: a whole buffer overlaps each of its regions
    from speck.hcq import Buffer

    whole = Buffer("CPU:1", 8, np.float32)
    lo, hi = whole.view(4, np.float32, 0), whole.view(4, np.float32, 16)
    inner = hi.view(2, np.float32, 8)
    other, elsewhere = Buffer("CPU:1", 8, np.float32), Buffer("CPU", 8, np.float32)
    run = runner._Run(runner.Plan([], 6), [whole, lo, hi, inner, other, elsewhere], {}, False, None, True)
    run.inflight = {1: ("copy into lo", 1, *runner._extent(lo), *runner._extent(elsewhere))}
    assert run._waits([0]) == [("copy into lo", 1)]
    assert run._waits([2, 3, 4]) == []
    run.inflight = {0: ("copy into whole", 1, *runner._extent(whole), *runner._extent(elsewhere))}
    assert run._waits([3]) == [("copy into whole", 1)] and run._waits([4]) == []
    # ...and by the memory they read: a call overwriting any of it waits too (a call only reading it does not)
    run.inflight = {5: ("copy from hi", 1, *runner._extent(elsewhere), *runner._extent(hi))}
    assert run._waits([3], written=[3]) == [("copy from hi", 1)] and run._waits([0], written=[0]) != []
    assert run._waits([3]) == [] and run._waits([1], written=[1]) == []


def test_multi_device_kernels_run_on_the_devices_engine_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    # a schedule over several CPU devices queues each kernel on its device's compute engine (run by that engine's
    # thread, beside the other devices' kernels and the copies) instead of running them one by one on this thread
    import threading

    from speck.hcq.cpu import CPUProgram

    seen: list[tuple[str, str]] = []
    launch = CPUProgram.launch

    def spy(self: CPUProgram, *args: object) -> None:
        seen.append((self.device.name, threading.current_thread().name))
        launch(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(CPUProgram, "launch", spy)
    a = _np((4, 4096), seed=3)
    x = _sharded(a, CPU4, 0)
    seen.clear()
    with Context(RING=2, ALL2ALL=0):
        s = x.sum(0).realize()
    np.testing.assert_allclose(s.numpy(), a.sum(0), rtol=1e-5, atol=1e-6)
    assert len(seen) == 4 * 3  # the reduce-scatter's adds
    assert {d for d, _ in seen} == set(CPU4)
    assert all(t.startswith(f"hcq-{d}:compute") for d, t in seen), seen


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shards_on_the_source_device_do_not_alias_the_source(axis: int | None) -> None:
    """Sharding a realized tensor over devices that include its own: the shard on its device is a copy (a view would
    let writes through the sharded tensor change the source, and the source's writes change the shards)."""
    src = np.arange(8, dtype=np.float32).reshape(2, 4)
    x = Tensor(src).contiguous().realize()
    xs = x.shard(CPU2, axis=axis).realize()
    xs.assign(xs * 10).realize()
    np.testing.assert_array_equal(x.numpy(), src)
    np.testing.assert_array_equal(xs.numpy(), src * 10)
    x.assign(x + 1).realize()
    np.testing.assert_array_equal(xs.numpy(), src * 10)
    # a pending computation's shard gets memory of its own too: the same (interned) computation realized through
    # another tensor (load_state_dict shares the pending initial values) must not become the shard's buffer
    Tensor.manual_seed(4)
    a, b = nn.Linear(6, 4), nn.Linear(6, 4)
    for pa, pb in zip(get_parameters(a), get_parameters(b)):
        pb.replace(pa).realize()
    for pa in get_parameters(a):
        pa.to_(CPU2)
    inp = Tensor.randn(4, 6).realize()
    oa, ob = nn.optim.SGD(get_parameters(a), lr=0.1), nn.optim.SGD(get_parameters(b), lr=0.1)
    with Tensor.train():
        for _ in range(2):
            oa.zero_grad()
            la = a(inp.shard(CPU2, axis=axis if axis is None else 0)).square().mean()
            la.backward().realize(*oa.schedule_step())
            ob.zero_grad()
            lb = b(inp).square().mean()
            lb.backward().realize(*ob.schedule_step())
            np.testing.assert_allclose(la.item(), lb.item(), rtol=1e-6)


# ---------------- scatter on sharded tensors ----------------
@pytest.mark.parametrize("mode", [None, "sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("shard", ["replicated", "axis0", "axis1", "self_only"])
def test_scatter_on_sharded_operands_matches_one_device(mode: str | None, shard: str) -> None:
    """scatter / scatter_reduce whose self, index or src is sharded (or replicated) gives the one-device result,
    sharded like self: every device scatters into a whole copy (the flat positions are global). It built a plain
    ASSIGN over the multi operands, which failed to realize (IndexError in the schedule cache, or an unknown device
    "('CPU', 'CPU:1')"); gradients equal the one-device ones too (the gradient rules flattened or flipped a sharded
    axis: ShardingError)."""
    base, src = _np((4, 6), 1), _np((4, 6), 2)
    idx = np.array([[0, 1, 2, 3, 0, 1], [1, 1, 0, 0, 3, 3], [2, 2, 2, 2, 2, 2], [3, 0, 3, 0, 3, 0]], np.int32)

    def run(b: Tensor, ix: Tensor, s: Tensor) -> Tensor:
        return b.scatter(0, ix, s) if mode is None else b.scatter_reduce(0, ix, s, reduce=mode)

    b1, s1 = Tensor(base, requires_grad=True), Tensor(src, requires_grad=True)
    want = run(b1, Tensor(idx), s1)
    (want * want).sum().backward()
    axes = {"replicated": (None, None, None), "axis0": (0, 0, 0), "axis1": (1, 1, None), "self_only": (0, None, None)}
    ab, ai, asrc = axes[shard]
    b = Tensor(base).shard(CPU2, ab)
    ix = Tensor(idx).shard(CPU2, ai) if shard != "self_only" else Tensor(idx).shard(CPU2)
    s = Tensor(src).shard(CPU2, asrc)
    b.requires_grad = s.requires_grad = True
    out = run(b, ix, s)
    assert isinstance(out.uop, MultiUOp) and out.uop.axis == ab and out.device == b.device
    (out * out).sum().backward()  # the gradient rules (dense one-hot form for None/sum, the scatter's for the rest)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6)
    for got, ref in ((b.grad, b1.grad), (s.grad, s1.grad)):
        assert got is not None and ref is not None
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_expert_parallel_moe_routing_counts_with_scatter_reduce() -> None:
    """A mixture-of-experts router's per-expert token counts (scatter_reduce of ones at the top-k expert ids) with
    the tokens sharded over two devices (data parallel) equal the one-device counts, and so do the gradients."""
    x, w = _np((6, 4), 3), _np((4, 3), 4)

    def run(shard: bool) -> tuple[np.ndarray, np.ndarray]:
        xt, wt = Tensor(x), Tensor(w, requires_grad=True)
        if shard:
            xt, wt = xt.shard(CPU2, 0), wt.shard(CPU2)
            wt.requires_grad = True
        probs = (xt @ wt).softmax(-1)
        top, sel = probs.topk(2)
        counts = Tensor.zeros(3, device=xt.device).scatter_reduce(0, sel.flatten(), Tensor.ones(12, device=xt.device),
                                                                  reduce="sum")  # fmt: skip
        (top.sum() * counts.sum()).backward()
        assert wt.grad is not None
        return counts.numpy(), wt.grad.numpy()

    (c1, g1), (c2, g2) = run(False), run(True)
    np.testing.assert_array_equal(c2, c1)
    assert c1.sum() == 12
    np.testing.assert_allclose(g2, g1, rtol=1e-5, atol=1e-6)
