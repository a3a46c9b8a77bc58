"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): TinyJit's
call timeline, input rules and errors (TENSOR_API 11), sharded tensors and their allreduce (12), max_pool2d
indices and attention in half (7.4/7.5) - the probes a tinygrad test file writes, checked against numpy."""

import pickle
import unittest

import numpy as np
from tinygrad import GlobalCounters, Tensor, TinyJit, Variable, dtypes
from tinygrad.engine.jit import JitError
from tinygrad.helpers import Context

D2 = ("CPU:0", "CPU:1")
D3 = ("CPU:0", "CPU:1", "CPU:2")


class TestJitTimeline(unittest.TestCase):
    def test_first_runs_second_captures_then_replays_the_same_objects(self):
        calls = []

        @TinyJit
        def f(x):
            calls.append(1)
            return (x * 2).realize()

        outs = []
        for i in range(5):
            outs.append(f(Tensor([float(i)] * 3)))
            self.assertEqual(outs[-1].tolist(), [2.0 * i] * 3)
            self.assertEqual(f.cnt, i + 1)
        self.assertEqual(len(calls), 2)
        self.assertIsNotNone(f.captured)
        self.assertIs(outs[2], outs[4])

    def test_non_tensor_args_are_baked_in(self):
        @TinyJit
        def f(x, k):
            return x * k

        got = [f(Tensor([1.0, 2.0]), k).tolist() for k in (1, 2, 3, 4)]
        self.assertEqual(got[3], [2.0, 4.0])

    def test_closure_tensor_updates_by_assign_are_seen(self):
        w = Tensor([1.0, 2.0, 3.0]).realize()

        @TinyJit
        def f(x):
            return (x * w).realize()

        for _ in range(3):
            f(Tensor.ones(3))
        w.assign(Tensor([10.0, 20.0, 30.0])).realize()
        self.assertEqual(f(Tensor.ones(3)).tolist(), [10.0, 20.0, 30.0])

    def test_nested_returns_and_list_dict_inputs(self):
        @TinyJit
        def f(xs, d):
            return {"a": (xs[0] + d["y"], [xs[1] * 2, None]), "b": None}

        for i in range(4):
            r = f([Tensor([float(i)]), Tensor([1.0])], {"y": Tensor([10.0])})
        self.assertEqual((r["a"][0].item(), r["a"][1][0].item(), r["a"][1][1], r["b"]), (13.0, 2.0, None, None))

    def test_reset_captures_again(self):
        calls = []

        @TinyJit
        def f(x):
            calls.append(1)
            return x + 1

        for _ in range(3):
            f(Tensor([1.0]))
        f.reset()
        self.assertIsNone(f.captured)
        for _ in range(3):
            r = f(Tensor([5.0]))
        self.assertEqual((len(calls), r.item()), (4, 6.0))

    def test_methods_share_one_capture(self):
        class M:
            def __init__(self, k):
                self.w = Tensor([k]).realize()

            @TinyJit
            def __call__(self, x):
                return x * self.w

        a, b = M(2.0), M(3.0)
        got = [a(Tensor([1.0])).item() for _ in range(3)] + [b(Tensor([1.0])).item()]
        self.assertEqual(got, [2.0, 2.0, 2.0, 2.0])  # quirk: b replays a's capture

    def test_output_fed_back_in(self):
        @TinyJit
        def f(x):
            return x * 2

        x = Tensor([1.0]).contiguous()
        for _ in range(5):
            x = f(x)
        self.assertEqual(x.item(), 32.0)

    def test_pickled_capture_replays_and_cannot_reset(self):
        @TinyJit
        def f(x):
            return x * 2

        for _ in range(3):
            f(Tensor.ones(4).contiguous())
        g = pickle.loads(pickle.dumps(f))
        self.assertEqual(g(Tensor([1.0, 2.0, 3.0, 4.0])).tolist(), [2.0, 4.0, 6.0, 8.0])
        with self.assertRaises(AssertionError):
            g.reset()


class TestJitErrors(unittest.TestCase):
    def _captured(self, fn, *args):
        j = TinyJit(fn)
        for _ in range(3):
            j(*args)
        return j

    def test_changed_shape_dtype_device_layout(self):
        j = self._captured(lambda x: x + 1, Tensor.ones(4).contiguous())
        bads = (Tensor.ones(5), Tensor.ones(4, dtype=dtypes.int32), Tensor.ones(2, 2), Tensor.ones(4, device="CPU:1"))
        for bad in bads:
            with self.assertRaises(JitError):
                j(bad.contiguous())
        with self.assertRaises(JitError):
            j(x=Tensor.ones(4).contiguous())

    def test_duplicate_and_virtual_inputs(self):
        f = TinyJit(lambda a, b: a + b)
        t = Tensor.ones(6).realize()
        with self.assertRaises(JitError):
            f(t, t)
        with self.assertRaises(JitError):
            f(t[:3], t[3:])
        with self.assertRaises(JitError):
            TinyJit(lambda x: x + 1)(Tensor(3))

    def test_capture_errors(self):
        nothing = TinyJit(lambda x: x)
        nothing(Tensor([1.0]))
        with self.assertRaises(JitError):
            nothing(Tensor([1.0]))
        scalar = TinyJit(lambda x: (x + 1, 3))
        scalar(Tensor([1.0]))
        with self.assertRaises(JitError):
            scalar(Tensor([1.0]))

        def reads(x):
            y = x + 1
            y.numpy()
            return y

        r = TinyJit(reads)
        r(Tensor([1.0]))
        with self.assertRaises(JitError):
            r(Tensor([1.0]))

    def test_nested_capture_is_a_runtime_error(self):
        inner = TinyJit(lambda x: x + 1)
        outer = TinyJit(lambda x: inner(x) * 2)
        with self.assertRaises(RuntimeError):
            for i in range(4):
                outer(Tensor([float(i)]))


class TestMulti(unittest.TestCase):
    def test_shard_ops_keep_or_allreduce(self):
        a = np.arange(24, dtype=np.float32).reshape(4, 6)
        x = Tensor(a).shard(D2, axis=0)
        self.assertEqual((x.device, x.shape, x.uop.axis), (("CPU", "CPU:1"), (4, 6), 0))
        s1, s0 = x.sum(1), x.sum(0)
        self.assertEqual((s1.uop.axis, s0.uop.axis), (0, None))
        np.testing.assert_allclose(s0.numpy(), a.sum(0))
        np.testing.assert_allclose((x * Tensor(a).shard(D2, axis=1)).numpy(), a * a)
        with self.assertRaises(RuntimeError):
            Tensor(a).shard(("CPU:0", "CPU:1", "CPU:2", "CPU:3"), axis=1)
        with self.assertRaises(RuntimeError):
            x.flip(0).realize()

    def test_naive_allreduce_copies_every_ordered_pair(self):
        x = Tensor(np.ones((6, 10), np.float32)).shard(D3, axis=0).realize()
        with Context(RING=0, ALL2ALL=0):
            GlobalCounters.reset()
            x.sum(0).realize()
            self.assertEqual(GlobalCounters.copy_count, 3 * 2)

    def test_symbolic_allreduce(self):
        a = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
        v = Variable("n", 1, 8)
        x = Tensor(a).shard(D3, axis=0)
        for n in (2, 5):
            s = x.shrink(((0, 3), (0, v.bind(n)))).sum(0)
            self.assertAlmostEqual((s * s).sum().item(), float((a[:, :n].sum(0) ** 2).sum()), places=3)


class TestPoolAttention(unittest.TestCase):
    def test_max_pool_indices_of_nan_and_minus_inf_windows(self):
        x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
        x[0, 0, 1, 1] = np.nan
        _, idx = Tensor(x).max_pool2d(kernel_size=2, return_indices=True)
        self.assertEqual(idx.numpy()[0, 0, 0, 0], 5)
        ninf = np.full((1, 1, 2, 2), -np.inf, np.float32)
        _, idx = Tensor(ninf).max_pool2d(kernel_size=2, stride=1, padding=1, return_indices=True)
        self.assertEqual(idx.numpy().tolist(), [[[[0, 0, 1], [0, 0, 1], [2, 2, 3]]]])

    def test_sdpa_half_long_rows_do_not_overflow(self):
        q = (20 + np.random.default_rng(1).standard_normal((1, 1, 2, 256))).astype(np.float16)
        out = Tensor(q).scaled_dot_product_attention(Tensor(q), Tensor(q))
        self.assertEqual(out.dtype, dtypes.half)
        self.assertFalse(np.isnan(out.numpy()).any())


if __name__ == "__main__":
    unittest.main()
