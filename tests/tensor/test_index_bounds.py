"""Out-of-range index tensors are an error users see (CHECK_OOB, on by default): the kernel that reads the index
records the first violation on the device, and the next data read (or TinyJit replay) raises
IndexOutOfBoundsError naming the op, the index and the bound. In-range results are unchanged; CHECK_OOB=0 gives
the unchecked behaviour (out-of-range reads 0, writes are dropped) with no check code in the kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, TinyJit, assert_kernel_count, dtypes, nn
from speck.tensor.counters import GlobalCounters
from speck.tensor.errors import IndexOutOfBoundsError, TensorError
from speck.tensor.nn.optim import SGD
from speck.tensor.schedule import Scheduler
from speck.uop import Ops
from tensor_helpers import FEW, assert_matches

X = np.arange(1, 13, dtype=np.float32).reshape(3, 4)


def _idx(v: Any) -> Tensor:
    return Tensor(np.asarray(v, dtype=np.int32))


# (op name in the message, the index value named, the bound named, a function computing the op on bad indices)
BAD: list[tuple[str, int, str, Callable[[], Tensor]]] = [
    ("getitem", 5, "size 3", lambda: Tensor(X)[_idx([0, 5])]),
    ("getitem", -4, "size 3", lambda: Tensor(X)[_idx([-4, 1])]),
    ("getitem", 9, "size 4", lambda: Tensor(X)[:, _idx([9])]),
    ("gather", 4, "size 4", lambda: Tensor(X).gather(1, _idx([[0, 4], [1, 1], [2, 2]]))),
    ("gather", -5, "size 4", lambda: Tensor(X).gather(1, _idx([[0, -5], [1, 1], [2, 2]]))),
    ("scatter", 7, "size 4", lambda: Tensor(X).scatter(1, _idx([[0, 7]]), Tensor(np.ones((1, 2), np.float32)))),
    ("scatter", -1, "size 4", lambda: Tensor(X).scatter(1, _idx([[-1, 0]]), 2.0)),
    ("scatter", 6, "size 3",
     lambda: Tensor(X).scatter_reduce(0, _idx([[6, 0, 0, 0]]), Tensor(np.ones((1, 4), np.float32)), "sum")),
    ("Embedding", 10, "size 10", lambda: nn.Embedding(10, 3)(_idx([[1, 10]]))),
    ("Embedding", -1, "size 10", lambda: nn.Embedding(10, 3)(_idx([-1]))),
    ("one_hot", 4, "num_classes=4", lambda: _idx([0, 4, 1]).one_hot(4)),
    ("sparse_categorical_crossentropy", 3, "3 classes",
     lambda: Tensor(X[:, :3]).sparse_categorical_crossentropy(_idx([0, 3, 1]))),
    ("nll_loss", -2, "4 classes", lambda: Tensor(X).log_softmax(-1).nll_loss(_idx([0, -2, 1]), ignore_index=-1)),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{c[1]}" for c in BAD])
def test_out_of_range_index_raises_naming_op_index_and_bound(case: tuple[str, int, str, Callable[[], Tensor]]) -> None:
    op, index, bound, fn = case
    out = fn()
    with pytest.raises(IndexOutOfBoundsError) as e:
        out.numpy()
    msg = str(e.value)
    assert msg.startswith(f"{op}: ") and f" {index} is out of bounds for " in msg and bound in msg, msg
    assert isinstance(e.value, IndexError) and isinstance(e.value, TensorError)
    # the record was cleared: the next read is fine
    assert_matches(Tensor(X).sum().numpy(), X.sum())


def test_setitem_out_of_range_raises() -> None:
    t = Tensor(X.copy()).realize()
    t[_idx([0, 3])] = 5.0  # a realized target: the write kernel checks its positions
    with pytest.raises(IndexOutOfBoundsError, match=r"^setitem: index 3 is out of bounds for dim 0 with size 3"):
        t.numpy()
    u = Tensor(X) + 0  # an unrealized target: the merged value's scatter
    u[:, _idx([-5])] = 1.0
    with pytest.raises(IndexOutOfBoundsError, match=r"^setitem: index -5 is out of bounds for dim 1 with size 4"):
        u.numpy()


def test_in_range_setitem_and_negative_indices_unchanged() -> None:
    t = Tensor(X.copy()).realize()
    t[_idx([0, -1])] = 5.0
    ref = X.copy()
    ref[[0, -1]] = 5.0
    assert_matches(t.numpy(), ref)
    assert_matches(Tensor(X)[_idx([-1, 0, -3])].numpy(), X[[-1, 0, -3]])


def test_ignore_index_label_is_allowed() -> None:
    logits = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = Tensor(logits).sparse_categorical_crossentropy(_idx([1, -1, 3]), ignore_index=-1).numpy()
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    assert_matches(got, -(lp[0, 1] + lp[2, 3]) / 2, atol=1e-5)
    with pytest.raises(IndexOutOfBoundsError, match=r"label -2 is out of bounds for 4 classes"):
        Tensor(logits).sparse_categorical_crossentropy(_idx([1, -2, 3]), ignore_index=-1).numpy()


def test_realize_raises_where_the_kernels_ran_synchronously() -> None:
    """On a host device the kernels have run when realize returns: realize raises (the tensor is realized)."""
    bad = Tensor(X)[_idx([7])]
    with pytest.raises(IndexOutOfBoundsError, match="index 7"):
        bad.realize()
    with pytest.raises(IndexOutOfBoundsError, match="index 7"):
        Tensor.realize_all(Tensor(X)[_idx([1])], Tensor(X)[_idx([7])])
    assert_matches(bad.numpy()[:, :0], np.zeros((1, 0), np.float32))  # reported once: the record was cleared
    assert_matches(Tensor([1.0, 2.0]).numpy(), np.array([1.0, 2.0], np.float32))


def test_first_violation_wins() -> None:
    a = Tensor(X)[_idx([8])]
    b = Tensor(X).gather(1, _idx([[6], [0], [0]]))
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 8"):
        Tensor.realize_all(a, b)  # a's kernel runs first and records; b's finds the record taken
    assert_matches(b.numpy()[1:], X[1:, :1])  # its in-range rows are right, and nothing is left to report


def test_tinyjit_replay_raises() -> None:
    @TinyJit
    def pick(x: Tensor, i: Tensor) -> Tensor:
        return (x[i] * 2).realize()

    for k in range(3):  # run, capture, replay: all in range
        assert_matches(pick(Tensor(X), _idx([k % 3, 2])).numpy(), X[[k % 3, 2]] * 2)
    assert pick.captured is not None
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 3 is out of bounds for dim 0 with size 3"):
        pick(Tensor(X), _idx([3, 0]))  # the replay itself raises (host-visible record, no extra sync)
    assert_matches(pick(Tensor(X), _idx([1, -1])).numpy(), X[[1, -1]] * 2)


def test_training_step_under_jit_raises_for_a_bad_label() -> None:
    rng = np.random.default_rng(1)
    w = Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    opt = SGD([w], lr=0.1)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (x @ w).sparse_categorical_crossentropy(y).backward()
            opt.step()
        return loss.realize()

    x = Tensor(rng.standard_normal((5, 4)).astype(np.float32))
    for _ in range(3):
        step(x, _idx([0, 1, 2, 0, 1])).item()
    with pytest.raises(IndexOutOfBoundsError, match=r"^sparse_categorical_crossentropy: label 3 "):
        step(x, _idx([0, 1, 3, 0, 1]))


@given(seed=st.integers(0, 2**16), dim=st.integers(0, 2))
@FEW
def test_gather_negative_indices_match_take_along_axis(seed: int, dim: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    n = a.shape[dim]
    shape = list(a.shape)
    shape[dim] = int(rng.integers(1, 7))
    idx = rng.integers(-n, n, shape).astype(np.int32)
    assert_matches(Tensor(a).gather(dim, Tensor(idx)).numpy(), np.take_along_axis(a, idx, dim))


def _kernel_asts(out: Tensor) -> list[Any]:
    sched = Scheduler()
    sched.realize(out.uop)
    return [it.ast for it in sched.items if it.ast is not None]


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{c[1]}" for c in BAD])
def test_check_oob_0_is_the_unchecked_behaviour(case: tuple[str, int, str, Callable[[], Tensor]]) -> None:
    fn = case[3]
    with Context(CHECK_OOB=0):
        out = fn()
        assert not any(u.op is Ops.CHECK for u in out.uop.toposort())
        stores = [n for ast in _kernel_asts(out) for n in ast.toposort() if n.op is Ops.STORE]
        got = out.numpy()  # no error
    checked = fn()
    checked_stores = [n for ast in _kernel_asts(checked) for n in ast.toposort() if n.op is Ops.STORE]
    assert len(checked_stores) > len(stores)  # the check is kernel code, absent with CHECK_OOB=0
    assert np.isfinite(got.astype(np.float64)).all()


def test_check_oob_0_reads_zero_and_drops_writes() -> None:
    with Context(CHECK_OOB=0):
        assert_matches(Tensor(X)[_idx([0, 5])].numpy(), np.stack([X[0], np.zeros(4, np.float32)]))
        assert_matches(Tensor(X).gather(1, _idx([[4], [-5], [1]])).numpy(), np.array([[0], [0], [10]], np.float32))
        assert_matches(Tensor(X).scatter(1, _idx([[9]]), 0.0).numpy(), X)
        assert_matches(_idx([0, 4]).one_hot(3).numpy(), np.array([[1, 0, 0], [0, 0, 0]], np.int32))


@pytest.mark.parametrize("case", BAD, ids=[f"{c[0]}-{c[1]}" for c in BAD])
def test_the_check_adds_no_kernels(case: tuple[str, int, str, Callable[[], Tensor]]) -> None:
    fn = case[3]
    with Context(CHECK_OOB=0):
        n = len(_kernel_asts(fn()))
    assert len(_kernel_asts(fn())) == n


def test_the_check_adds_no_kernels_to_a_training_step() -> None:
    def step(check: int) -> int:
        with Context(CHECK_OOB=check):
            rng = np.random.default_rng(0)
            emb = nn.Embedding(11, 4)
            lin = nn.Linear(4, 5)
            opt = SGD([emb.weight, lin.weight, lin.bias], lr=0.1)
            with Tensor.train():
                opt.zero_grad()
                idx = Tensor(rng.integers(0, 11, (6,)).astype(np.int32))
                y = Tensor(rng.integers(0, 5, (6,)).astype(np.int32))
                loss = lin(emb(idx)).sparse_categorical_crossentropy(y).backward()
                new = opt.schedule_step()
                before = GlobalCounters.kernel_count
                Tensor.realize_all(loss, *new)
                return int(GlobalCounters.kernel_count - before)

    assert step(1) == step(0)


def test_index_dtypes_whose_values_all_fit_are_not_checked() -> None:
    t = Tensor(np.arange(256, dtype=np.float32))
    i = Tensor(np.array([0, 255, 7], np.uint8))
    assert not any(u.op is Ops.CHECK for u in t[i].uop.toposort())
    assert_matches(t[i].numpy(), np.array([0, 255, 7], np.float32))
    big = Tensor(np.array([3, 2**40], np.int64)).cast(dtypes.int64)
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 2147483647 or more is out of bounds"):
        t[big].numpy()
    with pytest.raises(IndexOutOfBoundsError, match=r"^gather: index -2147483648 or less is out of bounds"):
        t.gather(0, Tensor(np.array([-(2**40)], np.int64))).numpy()


def test_kernel_count_of_gather_is_unchanged() -> None:
    x, i = Tensor(X).realize(), _idx([[0, 1], [2, 3], [3, 3]]).realize()
    with assert_kernel_count(1):
        x.gather(1, i).realize()


BACKENDS = ["CPU:LLVM", pytest.param("CPU:CLANG", marks=pytest.mark.c_backend), "CPU:X86", "PYTHON"]


@pytest.mark.parametrize("device", BACKENDS)
def test_every_cpu_backend_runs_the_check(device: str) -> None:
    t = Tensor(X, device=device)
    assert_matches(t[Tensor(np.array([2, -1], np.int32), device=device)].numpy(), X[[2, -1]])
    with pytest.raises(IndexOutOfBoundsError, match=rf"^gather: index 9 .* on {device}"):
        t.gather(1, Tensor(np.array([[0], [9], [1]], np.int32), device=device)).numpy()
    with pytest.raises(IndexOutOfBoundsError, match=r"^sparse_categorical_crossentropy: label 5 "):
        t[:, :3].sparse_categorical_crossentropy(Tensor(np.array([0, 1, 5], np.int32), device=device)).numpy()
    with pytest.raises(IndexOutOfBoundsError, match=r"^scatter: index 7 "):
        t.scatter(1, Tensor(np.array([[7]], np.int32), device=device), 1.0).numpy()


def test_the_interpreter_runs_the_check() -> None:
    with Context(SPECK_CODEGEN=0):  # every kernel through codegen's AST interpreter
        with pytest.raises(IndexOutOfBoundsError, match=r"^Embedding: index 4 is out of bounds for size 4"):
            nn.Embedding(4, 2)(_idx([[0, 4]])).numpy()


EMB = nn.Embedding(5, 2)
JITTED: list[tuple[str, Callable[[Tensor], Tensor], np.ndarray, np.ndarray]] = [
    ("getitem", lambda i: Tensor(X)[i], np.array([2, -3], np.int32), np.array([0, 3], np.int32)),
    ("gather", lambda i: Tensor(X).gather(1, i.reshape(1, 2)), np.array([3, -4], np.int32), np.array([4, 0], np.int32)),
    ("scatter", lambda i: Tensor(X).scatter(1, i.reshape(1, 2), 0.0), np.array([3, 1], np.int32),
     np.array([-1, 0], np.int32)),
    ("Embedding", lambda i: EMB(i), np.array([4, 0], np.int32), np.array([5, 0], np.int32)),
    ("one_hot", lambda i: i.one_hot(5).cast(dtypes.int32), np.array([4, 0], np.int32), np.array([0, 6], np.int32)),
    ("sparse_categorical_crossentropy", lambda i: Tensor(X[:2]).sparse_categorical_crossentropy(i),
     np.array([3, 0], np.int32), np.array([0, 4], np.int32)),
]  # fmt: skip


@pytest.mark.parametrize("case", JITTED, ids=[c[0] for c in JITTED])
def test_every_op_raises_under_tinyjit_replay(
    case: tuple[str, Callable[[Tensor], Tensor], np.ndarray, np.ndarray],
) -> None:
    op, fn, good, bad = case

    @TinyJit
    def f(i: Tensor) -> Tensor:
        return fn(i).realize()

    want = fn(Tensor(good)).numpy()
    for _ in range(3):  # run, capture, replay
        assert_matches(f(Tensor(good.copy())).numpy(), want)
    assert f.captured is not None
    with pytest.raises(IndexOutOfBoundsError, match=rf"^{op}: "):
        f(Tensor(bad.copy()))
    assert_matches(f(Tensor(good.copy())).numpy(), want)  # in range again: no error, same values


def test_a_pickled_lazy_graph_keeps_its_check() -> None:
    import pickle

    good = pickle.loads(pickle.dumps(Tensor(X)[_idx([0, 2])]))
    assert_matches(good.numpy(), X[[0, 2]])
    bad = pickle.loads(pickle.dumps(Tensor(X)[_idx([0, 7])]))  # the record is the loading process's own
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 7 "):
        bad.numpy()


def test_getitem_names_the_users_dim() -> None:
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 9 is out of bounds for dim 1 with size 4"):
        Tensor(X)[0, _idx([9])].numpy()  # (the int removes dim 0 before the tensor index applies)
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index -4 is out of bounds for dim 0 with size 3"):
        Tensor(X)[None, _idx([-4]), 1:].numpy()


def test_device_less_indices_are_checked_on_the_data_device() -> None:
    assert_matches(Tensor(X)[Tensor(1)].numpy(), X[1])
    assert_matches(Tensor(X)[Tensor.arange(3) - 1].numpy(), X[[-1, 0, 1]])
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 5 is out of bounds for dim 0 with size 3"):
        Tensor(X)[Tensor(5)].numpy()
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 3 is out of bounds"):
        Tensor(X)[Tensor.arange(4)].numpy()


def test_no_record_on_a_device_that_runs_no_kernels(tmp_path: Any) -> None:
    from speck.tensor import bounds

    disk = Tensor(np.array([0, 7], np.int32)).to(f"disk:{tmp_path / 'idx.bin'}")
    assert bounds.checked(disk, "getitem", -3, 3) is disk  # no CHECK node, no record buffer on the file
    assert not any(d.startswith("disk:") for d in bounds._records)


# ---------------- synchronize, sharded indices ----------------
SHARDS = ("CPU:0", "CPU:1")


def test_synchronize_raises_what_the_devices_kernels_recorded() -> None:
    """A violation recorded by kernels that ran outside a realize (here a TinyJit's capture, which realizes without
    looking) is raised by the next Device[...].synchronize() of the device that recorded it."""
    from speck.tensor import Device

    @TinyJit
    def pick(x: Tensor, i: Tensor) -> Tensor:
        return x[i].realize()

    xs, bad = Tensor(X, device="CPU:1").realize(), Tensor(np.array([0, 5], np.int32), device="CPU:1").realize()
    pick(xs, Tensor(np.array([0, 1], np.int32), device="CPU:1").realize())
    pick(xs, bad)  # the capture: its kernels run, the record is left for the next look
    Device["CPU"].synchronize()  # another device's record is empty: nothing to report there
    with pytest.raises(IndexOutOfBoundsError, match=r"^getitem: index 5 is out of bounds for dim 0 .* on CPU:1"):
        Device["CPU:1"].synchronize()
    Device["CPU:1"].synchronize()  # reported once: the record was cleared
    assert_matches(Tensor([1.0, 2.0], device="CPU:1").numpy(), np.array([1.0, 2.0], np.float32))


def test_synchronize_after_an_in_range_index_is_quiet() -> None:
    from speck.tensor import Device

    good = Tensor(X)[_idx([2, -3])].realize()
    Device[good.device].synchronize()
    assert_matches(good.numpy(), X[[2, -3]])


def _sharded_embedding() -> nn.Embedding:
    emb = nn.Embedding(10, 3)
    emb.weight = Tensor(np.ones((10, 3), np.float32)).shard(SHARDS)
    return emb


SHARDED_BAD: list[tuple[str, int, Callable[[], Tensor]]] = [
    ("gather", 4, lambda: Tensor(X[:2]).shard(SHARDS, axis=0).gather(
        1, Tensor(np.array([[0, 4], [1, 1]], np.int32)).shard(SHARDS, axis=0))),
    ("getitem", 5, lambda: Tensor(X).shard(SHARDS)[Tensor(np.array([0, 5], np.int32)).shard(SHARDS)]),
    ("getitem", 5, lambda: Tensor(X).shard(SHARDS)[Tensor(5)]),  # a device-less index into sharded data
    ("Embedding", 11,
     lambda: _sharded_embedding()(Tensor(np.array([[1, 2], [3, 11]], np.int32)).shard(SHARDS, axis=0))),
    ("one_hot", 4, lambda: Tensor(np.array([0, 1, 4, 2], np.int32)).shard(SHARDS, axis=0).one_hot(4)),
]  # fmt: skip


@pytest.mark.parametrize("case", SHARDED_BAD, ids=[f"{c[0]}-{c[1]}" for c in SHARDED_BAD])
def test_sharded_index_out_of_range_raises(case: tuple[str, int, Callable[[], Tensor]]) -> None:
    op, index, fn = case
    out = fn()
    with pytest.raises(IndexOutOfBoundsError, match=rf"^{op}: .*{index} is out of bounds"):
        out.numpy()
    # every device's record was cleared (a replicated index recorded the violation on each): the next read is fine
    assert_matches(Tensor(X).shard(SHARDS).sum().numpy(), X.sum())


def test_sharded_index_out_of_range_raises_at_realize() -> None:
    idx = Tensor(np.array([[0, 1], [2, -9]], np.int32)).shard(SHARDS, axis=0)
    with pytest.raises(IndexOutOfBoundsError, match=r"^gather: index -9 .* on CPU:1"):  # the bad row: CPU:1's shard
        Tensor(X[:2]).shard(SHARDS, axis=0).gather(1, idx).realize()


@given(st.lists(st.integers(-6, 6), min_size=2, max_size=8).filter(lambda v: len(v) % 2 == 0))
@FEW
def test_sharded_gather_matches_numpy_or_raises(vals: list[int]) -> None:
    """A sharded gather is numpy's take_along_axis when every index is in range, else IndexOutOfBoundsError."""
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    idx = np.array(vals, np.int32).reshape(2, -1)
    out = Tensor(data).shard(SHARDS, axis=0).gather(1, Tensor(idx).shard(SHARDS, axis=0))
    if ((idx >= -4) & (idx < 4)).all():
        assert_matches(out.numpy(), np.take_along_axis(data, idx, 1))
    else:
        with pytest.raises(IndexOutOfBoundsError, match=r"^gather: index -?\d+ is out of bounds for dim 1 with size 4"):
            out.numpy()


def test_scatter_index_computed_by_a_reduction_is_checked_in_the_scatter_kernel() -> None:
    """An index that is a reduction's result (argmax, a sum cast to int) lowered into the scatter kernel: its bounds
    check loops only over the ranges the index varies over, not over the ones its reduction closes (the reduce
    range used to get a second END: ProgramFormError)."""
    probs = np.random.default_rng(0).random((7, 4)).astype(np.float32)
    got = Tensor.zeros(4).scatter_reduce(0, Tensor(probs).argmax(1), Tensor.ones(7), reduce="sum")
    np.testing.assert_array_equal(got.numpy(), np.bincount(probs.argmax(1), minlength=4))
    last = Tensor.zeros(4).scatter(0, Tensor(probs).argmax(1), Tensor.arange(7).float())
    want = np.zeros(4)
    for i, j in enumerate(probs.argmax(1)):
        want[j] = i
    np.testing.assert_array_equal(last.numpy(), want)
    big = (Tensor(probs).sum(1) * 10).cast(dtypes.int32)  # > 3: out of range, found by the same check
    with pytest.raises(IndexOutOfBoundsError, match="scatter"):
        Tensor.zeros(4).scatter(0, big, Tensor.ones(7)).numpy()
