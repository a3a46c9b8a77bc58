"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): corners
of valid input user code meets - random draws in narrow float dtypes, gradients of every scatter_reduce mode, dtypes
of int ** float, symbolic reshape with -1."""

import unittest

import numpy as np
from tinygrad import Device, Tensor, TinyJit, Variable, dtypes, nn


def scatter_reduce_grads(base, index, src, reduce, include_self, g):
    """torch's gradients of scatter_reduce along dim 0: 'prod' gives each contributor the product of the others,
    'amax'/'amin' split the gradient evenly between the contributors equal to the result."""
    contrib = {pos: [("b", pos, base[pos])] for pos in np.ndindex(*base.shape)}
    seen = set()
    for i in np.ndindex(*index.shape):
        pos = (int(index[i]),) + i[1:]
        if pos not in seen and not include_self:
            contrib[pos] = []
        seen.add(pos)
        contrib[pos].append(("s", i, src[i]))
    gb, gs = np.zeros(base.shape), np.zeros(src.shape)
    for pos, lst in contrib.items():
        vals = np.array([c[2] for c in lst], dtype=np.float64)
        if reduce == "prod":
            for k, c in enumerate(lst):
                (gb if c[0] == "b" else gs)[c[1]] += g[pos] * np.prod(np.delete(vals, k))
        else:
            best = vals.max() if reduce == "amax" else vals.min()
            ties = [c for c in lst if c[2] == best]
            for c in ties:
                (gb if c[0] == "b" else gs)[c[1]] += g[pos] / len(ties)
    return gb, gs


class TestRandNarrowFloats(unittest.TestCase):
    def test_rand_stays_below_one(self):
        for dt in (dtypes.half, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float32):
            r = Tensor.rand(20000, dtype=dt).numpy()
            self.assertTrue((r >= 0).all() and (r < 1).all(), f"{dt}: max {r.max()}")

    def test_rand_like_and_dropout_in_half(self):
        x = Tensor.ones(20000, dtype=dtypes.half)
        self.assertLess(x.rand_like().numpy().max(), 1)
        with Tensor.train():
            d = x.dropout(0.25).numpy()
        self.assertTrue(np.isin(d, [0, np.float16(1 / 0.75)]).all())


class TestScatterReduceBackward(unittest.TestCase):
    def test_every_mode_with_ties_and_zeros(self):
        rng = np.random.default_rng(0)
        for trial in range(24):
            reduce, include_self = ("amax", "amin", "prod")[trial % 3], bool(trial // 3 % 2)
            # small ints: ties between contributors and zeros in products are common
            base = rng.integers(-2, 3, (3, 4)).astype(np.float32)
            src = rng.integers(-2, 3, (2, 4)).astype(np.float32)
            index = rng.integers(0, 3, (2, 4))
            g = rng.standard_normal((3, 4)).astype(np.float32)
            b, s = Tensor(base), Tensor(src)
            out = b.scatter_reduce(0, Tensor(index.astype(np.int32)), s, reduce, include_self=include_self)
            gb, gs = out.gradient(b, s, gradient=Tensor(g))
            rb, rs = scatter_reduce_grads(base, index, src, reduce, include_self, g)
            np.testing.assert_allclose(gb.numpy(), rb, atol=1e-5, err_msg=f"{reduce} {include_self}")
            np.testing.assert_allclose(gs.numpy(), rs, atol=1e-5, err_msg=f"{reduce} {include_self}")

    def test_backward_fills_grad(self):
        x = Tensor([[1.0, 5.0], [3.0, 2.0]])
        src = Tensor([[4.0, 1.0]])
        x.scatter_reduce(0, Tensor([[1, 0]]), src, "amax").sum().backward()
        np.testing.assert_equal(x.grad.numpy(), [[1, 1], [0, 1]])
        np.testing.assert_equal(src.grad.numpy(), [[1, 0]])


class TestQrBackward(unittest.TestCase):
    def test_gradient_matches_finite_differences(self):
        rng = np.random.default_rng(1)
        a = rng.standard_normal((4, 3))
        w = rng.standard_normal((4, 3))

        def loss(x):  # R's diagonal signs are fixed by the Householder choice: smooth around a
            return float((Tensor(x, dtype=dtypes.float64).qr()[1] * Tensor(w)).sum().numpy())

        x = Tensor(a, dtype=dtypes.float64)
        (x.qr()[1] * Tensor(w)).sum().backward()
        num = np.zeros_like(a)
        for i in np.ndindex(*a.shape):
            d = np.zeros_like(a)
            d[i] = 1e-6
            num[i] = (loss(a + d) - loss(a - d)) / 2e-6
        np.testing.assert_allclose(x.grad.numpy(), num, atol=1e-5)


class TestPowLiteralDtypes(unittest.TestCase):
    def test_int_tensor_with_float_literal_is_weakfloat(self):
        # TENSOR_API 3.3/7.1: a float literal exponent makes an int or bool base weakfloat, integral or not
        for e in (2.0, 2.5, 0.5, -1.0, 0.0):
            for t in (Tensor([2, 3]), Tensor([True, False])):
                r = t**e
                self.assertEqual(r.dtype, dtypes.weakfloat, f"{t.dtype} ** {e}")
                with np.errstate(divide="ignore"):
                    ref = np.power(t.numpy().astype(np.float32), e)
                np.testing.assert_allclose(r.numpy(), ref, rtol=1e-6)
        self.assertEqual((Tensor([2]) ** 2).dtype, dtypes.int32)
        self.assertEqual(((Tensor([2]) ** 2.0) + Tensor([1.0]).half()).dtype, dtypes.half)


class TestSymbolicReshapeInferred(unittest.TestCase):
    def test_minus_one_next_to_symbolic_dims(self):
        a = np.arange(60, dtype=np.float32).reshape(10, 6)
        for n in (2, 5, 9):
            vi = Variable("i", 1, 10).bind(n)
            t = Tensor(a)[:vi]
            self.assertEqual(t.reshape(vi, -1).shape[1], 6)
            self.assertEqual(t.reshape(-1).sum().item(), a[:n].sum())
            np.testing.assert_equal(t.reshape(-1, 3).sum(0).numpy(), a[:n].reshape(-1, 3).sum(0))
            np.testing.assert_equal(t.reshape(-1, 2, 3).max((0, 2)).numpy(), a[:n].reshape(-1, 2, 3).max((0, 2)))

    def test_minus_one_that_does_not_divide_raises(self):
        with self.assertRaises(ValueError):
            Tensor.ones(10, 6)[: Variable("i", 1, 10).bind(3)].reshape(-1, 4)

    def test_in_a_jit_with_varying_sizes(self):
        a = Tensor(np.arange(40, dtype=np.float32).reshape(10, 4)).realize()

        @TinyJit
        def f(x):
            return x.reshape(-1, 2).sum(0).realize()

        for n in (3, 4, 5, 7):
            got = f(a[: Variable("i", 1, 10).bind(n)]).numpy()
            np.testing.assert_equal(got, np.arange(40).reshape(10, 4)[:n].reshape(-1, 2).sum(0))


class TestHalfStatistics(unittest.TestCase):
    def test_mean_divides_before_the_cast_back(self):
        # the float32 sum of 70000 twos is 140000, beyond half's 65504: the mean is still 2
        x = Tensor.full((70000,), 2.0, dtype=dtypes.half)
        self.assertEqual(x.mean().dtype, dtypes.half)
        self.assertEqual(x.mean().item(), 2.0)
        self.assertEqual(x.reshape(2, 35000).mean(1).tolist(), [2.0, 2.0])
        self.assertEqual(Tensor.full((70000,), 2.0, dtype=dtypes.bfloat16).mean().item(), 2.0)

    def test_var_and_std_of_large_half_values(self):
        a = (np.random.default_rng(0).standard_normal(70000) * 100).astype(np.float16)
        ref = np.var(a.astype(np.float64), ddof=1)
        self.assertEqual(Tensor(a).var().dtype, dtypes.half)
        np.testing.assert_allclose(Tensor(a).var().item(), ref, rtol=1e-3)
        np.testing.assert_allclose(Tensor(a).std(correction=0).item(), np.sqrt(np.var(a.astype(np.float64))), rtol=1e-3)
        v, m = Tensor(a).var_mean()
        np.testing.assert_allclose(m.item(), a.astype(np.float64).mean(), atol=0.05)

    def test_layernorm_in_half(self):
        a = (np.random.default_rng(1).standard_normal((2, 4096)) * 300).astype(np.float16)
        af = a.astype(np.float64)
        ref = (af - af.mean(-1, keepdims=True)) / np.sqrt(af.var(-1, keepdims=True) + 1e-5)
        out = Tensor(a).layernorm().numpy()
        self.assertTrue(np.isfinite(out).all())
        np.testing.assert_allclose(out, ref, atol=2e-2)

    def test_norm_layers_in_half(self):
        rng = np.random.default_rng(2)
        a = (rng.standard_normal((8, 4, 16, 16)) * 300).astype(np.float16)
        af = a.astype(np.float64)

        def norm(x, axes):
            return (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5)

        bn = nn.BatchNorm2d(4, affine=False, track_running_stats=False)
        with Tensor.train():
            out = bn(Tensor(a))
        self.assertEqual(out.dtype, dtypes.half)
        np.testing.assert_allclose(out.numpy(), norm(af, (0, 2, 3)), atol=2e-2)
        np.testing.assert_allclose(nn.GroupNorm(2, 4)(Tensor(a)).numpy(),
                                   norm(af.reshape(8, 2, -1), 2).reshape(a.shape), atol=2e-2)  # fmt: skip
        np.testing.assert_allclose(nn.LayerNorm(256)(Tensor(a).reshape(8, 4, 256)).numpy(),
                                   norm(af.reshape(8, 4, 256), 2), atol=2e-2)  # fmt: skip


class TestLerpIntEnds(unittest.TestCase):
    def test_fractional_weight_does_not_wrap(self):
        a, b = np.array([10, 200, 50], np.uint8), np.array([20, 100, 60], np.uint8)
        ref = a + (b.astype(np.float64) - a) * 0.5
        r = Tensor(a).lerp(Tensor(b), 0.5)
        self.assertEqual(r.dtype, dtypes.weakfloat)
        np.testing.assert_allclose(r.numpy(), ref)
        np.testing.assert_allclose(Tensor(a).lerp(Tensor(b), Tensor([0.5] * 3)).numpy(), ref)  # uint8 fixed point
        self.assertEqual(Tensor([100], dtype=dtypes.int8).lerp(Tensor([-100], dtype=dtypes.int8), 0.25).item(), 50)
        self.assertEqual(Tensor([200], dtype=dtypes.uint16).lerp(0, 0.5).item(), 100)

    def test_integer_weight_stays_int(self):
        r = Tensor([200], dtype=dtypes.uint8).lerp(Tensor([100], dtype=dtypes.uint8), 1)
        self.assertEqual((r.dtype, r.item()), (dtypes.uint8, 100))


class TestUnsignedDifferences(unittest.TestCase):
    def test_interpolate_uint8_image_linear(self):
        img = np.array([[[[200, 10], [10, 200]]]], np.uint8)
        for ac in (False, True):
            got = Tensor(img).interpolate((4, 5), align_corners=ac)
            ref = Tensor(img.astype(np.float32)).interpolate((4, 5), align_corners=ac).numpy().astype(np.uint8)
            self.assertEqual(got.dtype, dtypes.uint8)
            np.testing.assert_equal(got.numpy(), ref)
        np.testing.assert_equal(Tensor(img).interpolate((4, 4)).numpy()[0, 0, 0], [200, 152, 57, 10])

    def test_isclose_of_ints_does_not_wrap(self):
        a, b = np.array([3, 200], np.uint8), np.array([5, 100], np.uint8)
        np.testing.assert_equal(Tensor(a).isclose(Tensor(b), atol=3).numpy(), np.isclose(a, b, atol=3))
        a8, b8 = np.array([100, -100, 7], np.int8), np.array([-100, 100, 7], np.int8)
        np.testing.assert_equal(Tensor(a8).isclose(Tensor(b8), atol=150).numpy(), np.isclose(a8, b8, atol=150))
        self.assertFalse(Tensor(a).allclose(Tensor(b), atol=3).item())


class TestActivationsOfIntEdges(unittest.TestCase):
    def test_match_the_float_computation(self):
        # int8 127 + 3, abs(-128) and -x of uint8/bool wrap; the activations must not
        for src in (np.array([-128, 0, 127], np.int8), np.array([0, 1, 255], np.uint8), np.array([True, False])):
            for name in ("hardswish", "softsign", "logsigmoid", "hardtanh", "sigmoid", "gelu", "elu"):
                got = getattr(Tensor(src), name)().numpy()
                ref = getattr(Tensor(src.astype(np.float32)), name)().numpy()
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"{name} {src.dtype}")

    def test_clip_bounds_beyond_the_dtype_clip_nothing(self):
        a = np.array([0, 5, 200], np.uint8)
        for lo, hi in ((-1, 1), (-5, 300), (3, 1000)):
            got = Tensor(a).clip(lo, hi)
            self.assertEqual(got.dtype, dtypes.uint8)
            np.testing.assert_equal(got.numpy(), np.clip(a, lo, hi))


class TestLoadStateDictSharded(unittest.TestCase):
    def test_keeps_the_shard_axis(self):
        from tinygrad.nn.state import load_state_dict

        devs = (f"{Device.DEFAULT}:0", f"{Device.DEFAULT}:1")
        w = np.arange(8, dtype=np.float32).reshape(2, 4)
        m = nn.Linear(4, 2)
        m.weight.shard_(devs, axis=0)
        m.bias.shard_(devs)
        load_state_dict(m, {"weight": Tensor(w), "bias": Tensor([1.0, 2.0])}, verbose=False)
        self.assertEqual((m.weight.uop.axis, m.bias.uop.axis), (0, None))
        np.testing.assert_equal(m.weight.numpy(), w)
        out = m(Tensor.ones(2, 4).shard(devs, axis=0))
        np.testing.assert_equal(out.numpy(), np.ones((2, 4)) @ w.T + [1, 2])


class TestFactoryTensorsAreTheirOwn(unittest.TestCase):
    # two Tensor.zeros(3) are one graph node (hash-consing): realized, each must still get a buffer of its own
    def test_realized_together_then_written(self):
        ms = [Tensor.zeros(3).contiguous() for _ in range(3)]
        Tensor.realize(*ms)
        ms[0].assign(Tensor.ones(3)).realize()
        self.assertEqual([m.tolist() for m in ms], [[1.0] * 3, [0.0] * 3, [0.0] * 3])
        a, b = Tensor.full((3,), 2.0), Tensor.full((3,), 2.0)
        Tensor.realize(a, b)
        a += 1
        self.assertEqual((a.tolist(), b.tolist()), ([3.0] * 3, [2.0] * 3))

    def test_realized_separately_then_written(self):
        caches = [Tensor.zeros(2, 2).contiguous() for _ in range(2)]
        for c in caches:
            c.realize()
        caches[1][0, 0] = 5
        self.assertEqual(caches[0].tolist(), [[0.0, 0.0], [0.0, 0.0]])
        self.assertEqual(caches[1].tolist(), [[5.0, 0.0], [0.0, 0.0]])

    def test_constant_expressions_on_a_device(self):
        for make in (lambda: Tensor.arange(3, device=Device.DEFAULT), lambda: Tensor.ones(3) * 2,
                     lambda: Tensor.eye(3, device=Device.DEFAULT)[0]):  # fmt: skip
            a, b = make().contiguous(), make().contiguous()
            Tensor.realize(a, b)
            before = b.tolist()
            a += 1
            self.assertEqual(b.tolist(), before)
            c, d = make().contiguous(), make().contiguous()
            c.realize()
            d.realize()
            c += 1
            self.assertEqual(d.tolist(), before)

    def test_identical_graphs_over_buffers_share_as_in_tinygrad(self):
        x = Tensor([1.0, 2.0]).realize()
        c, d = x * 2, x * 2
        Tensor.realize(c, d)
        self.assertEqual((c.tolist(), d.tolist()), ([2.0, 4.0], [2.0, 4.0]))

    def test_one_tensor_realized_twice_in_one_call(self):
        a = Tensor.zeros(3).contiguous()
        Tensor.realize(a, a)
        a += 1
        self.assertEqual(a.tolist(), [1.0] * 3)


class TestReadThenBackward(unittest.TestCase):
    # reading data computes a copy and leaves the graph (TENSOR_API 0.1): the gradient still reaches the inputs
    def test_item_numpy_tolist_before_backward(self):
        for read in (lambda t: t.item(), lambda t: t.numpy(), lambda t: t.tolist()):
            y = Tensor([2.0])
            z = ((y * 3).sin() + y).sum()
            read(z)
            z.backward()
            self.assertIsNotNone(y.grad)
            np.testing.assert_allclose(y.grad.numpy(), [3 * np.cos(6.0) + 1], rtol=1e-5)

    def test_logged_loss_then_step(self):
        from tinygrad.nn.optim import SGD

        w = Tensor([1.0, -2.0])
        opt = SGD([w], lr=0.1)
        with Tensor.train():
            loss = (w * w).sum()
            self.assertEqual(loss.item(), 5.0)
            loss.backward()
            opt.step()
        np.testing.assert_allclose(w.numpy(), [0.8, -1.6], rtol=1e-6)


if __name__ == "__main__":
    unittest.main()
