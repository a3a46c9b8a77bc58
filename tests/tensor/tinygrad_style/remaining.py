"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): the
remaining incompatibilities of issue 28 as user code meets them - pending assigns, symbolic convolutions, sharded
training with several layers, literal dtypes of float functions, index checks and a KV-cache decode loop."""

import unittest

import numpy as np
from tinygrad import Device, GlobalCounters, Tensor, TinyJit, Variable, dtypes, nn
from tinygrad.nn.optim import LAMB, Adam
from tinygrad.nn.state import get_parameters
from tinygrad.uop.ops import UOp

DEVS = (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")


class TestPendingAssign(unittest.TestCase):
    def test_unrelated_realize_runs_one_kernel(self):
        a = Tensor.ones(4).contiguous().realize()
        b = Tensor.ones(4).contiguous().realize()
        a += 1
        GlobalCounters.reset()
        (b * 3).realize()
        self.assertEqual(GlobalCounters.kernel_count, 1)
        self.assertEqual(a.tolist(), [2.0] * 4)

    def test_setitem_schedule(self):
        a = Tensor.zeros(4, 4).contiguous().realize()
        a[1:3, 2] = 5
        self.assertEqual(len(a.schedule()), 1)
        self.assertEqual(a[:, 2].tolist(), [0, 5, 5, 0])


class TestSymbolicConv(unittest.TestCase):
    def test_conv2d(self):
        x = Tensor.rand(1, 2, 6, 16).realize()
        w = Tensor.rand(3, 2, 3, 3).realize()
        for i in (5, 9):
            vi = Variable("i", 4, 16).bind(i)
            got = x[:, :, :, :vi].conv2d(w, padding=1)[:, :, :, :i].numpy()
            np.testing.assert_allclose(got, x[:, :, :, :i].conv2d(w, padding=1).numpy(), atol=1e-5, rtol=1e-5)


class TestShardedTraining(unittest.TestCase):
    def _train(self, opt_cls, sharded):
        Tensor.manual_seed(3)
        layers = [nn.Linear(16, 16) for _ in range(3)]
        if sharded:
            for lin in layers:
                lin.weight.shard_(DEVS, axis=0)
                lin.bias.shard_(DEVS, axis=None)
        opt = opt_cls(get_parameters(layers), lr=0.01)
        x = Tensor.rand(8, 16).realize()
        if sharded:
            x = x.shard(DEVS, axis=0).realize()

        @TinyJit
        @Tensor.train()
        def step(x):
            opt.zero_grad()
            loss = x.sequential(layers).square().mean().backward()
            opt.step()
            return loss

        for _ in range(4):
            step(x)
        return [p.numpy() for p in get_parameters(layers)]

    def test_adam_and_lamb_match_one_device(self):
        for opt_cls in (Adam, LAMB):
            for a, b in zip(self._train(opt_cls, True), self._train(opt_cls, False)):
                np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


class TestShardedWrites(unittest.TestCase):
    def test_value_before_write_keeps_old(self):
        a = Tensor([1.0, 2.0, 3.0, 4.0]).shard(DEVS, axis=0).realize()
        b = a * 2
        a += 1
        self.assertEqual(b.tolist(), [2.0, 4.0, 6.0, 8.0])
        self.assertEqual(a.tolist(), [2.0, 3.0, 4.0, 5.0])


class TestMnistLabels(unittest.TestCase):
    def test_uint8_labels(self):
        logits = Tensor.randn(4, 10)
        labels = Tensor([1, 2, 3, 9], dtype=dtypes.uint8)
        ref = logits.sparse_categorical_crossentropy(labels.cast(dtypes.int32)).item()
        self.assertAlmostEqual(logits.sparse_categorical_crossentropy(labels).item(), ref, places=5)
        self.assertEqual((labels != -1).tolist(), [True] * 4)


class TestDtypesAndIndices(unittest.TestCase):
    def test_sigmoid_of_int_is_weak(self):
        self.assertEqual(Tensor([1, 2, 3]).sigmoid().dtype, dtypes.weakfloat)
        self.assertEqual(Tensor([1, 2, 3]).exp().dtype, dtypes.float32)

    def test_gather_float_index(self):
        with self.assertRaises(TypeError):
            Tensor([[1.0, 2.0]]).gather(1, Tensor([[0.0, 1.0]]))

    def test_uint64_literal(self):
        self.assertEqual(Tensor([2**63 + 1], dtype=dtypes.uint64).item(), 2**63 + 1)


class TestKVCacheDecode(unittest.TestCase):
    def test_decode(self):
        dim, ctx = 8, 16
        wq = Tensor.rand(dim, dim).realize()
        cache = Tensor.zeros(ctx, dim).contiguous().realize()

        def step(x, start_pos):
            assert isinstance(start_pos, UOp)
            cache[start_pos : start_pos + 1].assign(x @ wq).realize()
            return (x @ cache[: start_pos + 1].T).softmax().sum(-1).realize()

        jstep = TinyJit(step)
        xs = [Tensor.rand(1, dim).realize() for _ in range(6)]
        outs = [jstep(x, Variable("start_pos", 1, ctx - 1).bind(i + 1)).item() for i, x in enumerate(xs)]
        np.testing.assert_allclose(outs, 1.0, rtol=1e-5)
        want = np.concatenate([x.numpy() @ wq.numpy() for x in xs])
        np.testing.assert_allclose(cache[1:7].numpy(), want, rtol=1e-5)
        np.testing.assert_equal(cache[7:].numpy(), 0)
        self.assertEqual(Variable("start_pos", 1, ctx - 1).bind(4).val, 4)


if __name__ == "__main__":
    unittest.main()
