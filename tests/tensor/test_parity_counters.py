"""GlobalCounters as tinygrad's users read them (TENSOR_API 2.3, issue 28 §3): `mem_used`/`mem_used_per_device`
return to the baseline once a tensor is gone and are never negative (an idle device engine held the buffers of
its last copy, so a copy's source stayed counted until the next one came); a program's `estimates.mem` is the
global memory it touches (each buffer's loads and stores count at most its size, as tinygrad's estimate), so
`global_mem` is proportional to the data and `global_ops` counts the kernel's arithmetic, not its addressing."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from speck.tensor import Context, Device, GlobalCounters, Tensor, dtypes
from speck.tensor.engine.realize import lower_schedule_item

N = 100
DEVS = ("CPU:1", "CPU:2")


def _used(*devs: str) -> tuple[int, dict[str, int]]:
    for d in devs:
        Device[d].synchronize()
    gc.collect()
    return GlobalCounters.mem_used, dict(GlobalCounters.mem_used_per_device)


def test_a_copy_frees_its_source_and_del_frees_everything() -> None:
    base, base_dev = _used("CPU", *DEVS)
    t = Tensor.zeros(N, N).contiguous().to(DEVS).realize()
    used, per_dev = _used("CPU", *DEVS)
    assert used - base == 2 * N * N * 4  # the source on CPU is gone: only the two replicas
    assert [per_dev[d] - base_dev.get(d, 0) for d in ("CPU", *DEVS)] == [0, N * N * 4, N * N * 4]
    del t
    used, per_dev = _used("CPU", *DEVS)
    assert used == base and all(per_dev[d] == base_dev.get(d, 0) for d in DEVS)


@pytest.mark.parametrize("devices", [DEVS, ("CPU", "CPU:1")])
def test_sharding_does_not_add_memory_and_counts_never_go_negative(devices: tuple[str, str]) -> None:
    base, base_dev = _used("CPU", *devices)
    t = Tensor.zeros(N, N).contiguous().shard(devices, axis=0).realize()
    used, per_dev = _used("CPU", *devices)
    assert used - base == N * N * 4
    assert all(per_dev[d] - base_dev.get(d, 0) == N * (N // 2) * 4 for d in devices)
    del t
    used, per_dev = _used("CPU", *devices)
    assert used == base and min(per_dev.values()) >= 0 and GlobalCounters.mem_used >= 0


def _mem(t: Tensor) -> int:
    return int(lower_schedule_item(t.schedule()[-1]).prg.estimates.mem)


def test_estimated_memory_is_the_data_touched() -> None:
    u8 = dtypes.uint8
    a, b = Tensor.empty(256, 256, dtype=u8), Tensor.empty(256, 256, dtype=u8)
    assert _mem(a + b) == 256 * 256 * 3  # two reads and a write
    assert _mem(a + a.T) == 256 * 256 * 2  # one buffer read twice: read once
    col = Tensor.empty(256, 1, dtype=u8).expand(256, 256)
    assert _mem(col + b) == 256 * 256 * 2 + 256
    x, w = Tensor.empty(64, 64), Tensor.empty(64, 64)
    assert _mem(x @ w) == 3 * 64 * 64 * 4  # the loop nest reads each input 64 times; memory sees it once
    assert _mem(Tensor.empty(64 * 64).sum()) == 64 * 64 * 4 + 4


@pytest.mark.parametrize("batch", [1, 4])
def test_global_ops_count_the_arithmetic(batch: int) -> None:
    a, b = Tensor.empty(batch, 16, 16, dtype=dtypes.half), Tensor.empty(1, 16, 16, dtype=dtypes.half)
    GlobalCounters.reset()
    (a @ b).realize()
    assert GlobalCounters.global_ops == batch * 16**3 * 2  # a multiply and an add per term, no index arithmetic


def test_global_mem_scales_with_the_dtype() -> None:
    mem = {}
    for dt in (dtypes.float32, dtypes.half):
        a = Tensor.empty(32, 32, dtype=dt, device=DEVS[0]).shard(DEVS, axis=0)
        b = Tensor.empty(32, 32, dtype=dt, device=DEVS[0]).shard(DEVS, axis=None)
        GlobalCounters.reset()
        (a @ b).realize()
        mem[dt] = GlobalCounters.global_mem
    assert mem[dtypes.half] * 2 == mem[dtypes.float32]


def test_allreduce_cast_moves_and_writes_the_narrow_dtype() -> None:
    """ALLREDUCE_CAST: the partial sums of a bfloat16 tensor are written and sent as bfloat16 (the partial kernel
    narrows them itself), so less memory moves than without; the result is the same."""
    x = np.arange(32 * 32, dtype=np.float32).reshape(32, 32) % 7
    mem, out = {}, {}
    for cast in (0, 1):
        t = Tensor(x, device=DEVS[0]).cast(dtypes.bfloat16).realize().shard(DEVS, axis=0).realize()
        GlobalCounters.reset()
        with Context(ALLREDUCE_CAST=cast, SCACHE=0):
            r = t.sum(0).realize()
        mem[cast], out[cast] = GlobalCounters.global_mem, r.float().numpy()
    assert mem[1] < mem[0]
    np.testing.assert_array_equal(out[0], x.sum(0))
    np.testing.assert_array_equal(out[1], x.sum(0))


def test_a_realized_contiguous_is_not_computed_again() -> None:
    """A `.contiguous()` realized as part of one tensor is read from its buffer by later realizes (tinygrad keeps it
    as the buffer its tensors hold), also across a chain of pending writes fed by one shared projection (an LLM's
    KV-cache updates): the work grows with the layers, not with their square."""
    x, w = Tensor.ones(16, 16).contiguous().realize(), Tensor(np.arange(256).reshape(16, 16) / 256).float().realize()
    sh = (x @ w).contiguous()
    GlobalCounters.reset()
    (sh + 1).realize()
    assert GlobalCounters.kernel_count == 2
    np.testing.assert_allclose((sh * 2).numpy(), (np.ones((16, 16)) @ (np.arange(256).reshape(16, 16) / 256)) * 2,
                               rtol=1e-6)  # fmt: skip
    assert GlobalCounters.kernel_count == 3  # only the multiply: sh's buffer is read
    d, n = 8, 6
    caches = [Tensor.zeros(4, d).contiguous().realize() for _ in range(n)]
    ws = [Tensor.full((d, 2 * d), 0.5).contiguous().realize() for _ in range(n)]
    h, ref_h, ref_c = Tensor.ones(1, d).contiguous().realize(), np.ones((1, d)), np.zeros((4, d))
    for i in range(n):
        shared = (h @ ws[i]).contiguous()
        caches[i][0:1].assign(shared[:, :d])
        h = shared[:, d:] + caches[i][:1]
        s = ref_h @ np.full((d, 2 * d), 0.5)
        ref_c = np.zeros((4, d))
        ref_c[0:1] = s[:, :d]
        ref_h = s[:, d:] + ref_c[:1]
    GlobalCounters.reset()
    out = caches[-1][:1].contiguous().realize()
    assert GlobalCounters.kernel_count <= 2 * n + 1
    np.testing.assert_allclose(out.numpy(), ref_c[:1], rtol=1e-6)


def test_a_cached_contiguous_follows_writes_to_what_it_read() -> None:
    x = Tensor([1.0, 2.0, 3.0]).realize()
    sh = (x * 2).contiguous()
    (sh + 1).realize()
    x += 1  # sh was made before the write: it keeps the value of its time
    after = (x * 2).contiguous()  # made after: reads the new x
    assert sh.tolist() == [2.0, 4.0, 6.0] and after.tolist() == [4.0, 6.0, 8.0]
    c = Tensor([5.0, 6.0]).contiguous()
    c.realize()
    c[0] = 0.0  # a write into the contiguous's own buffer: every later read sees it
    assert c.tolist() == [0.0, 6.0] and (c + 0).tolist() == [0.0, 6.0]
