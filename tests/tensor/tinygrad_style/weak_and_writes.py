"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): literals,
device-less tensors, assign/setitem and gradients as user code meets them."""

import unittest

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import least_upper_dtype
from tinygrad.helpers import Context


class TestWeakDtypes(unittest.TestCase):
    def test_literal_dtypes(self):
        self.assertEqual(Tensor(1).dtype, dtypes.weakint)
        self.assertEqual(Tensor(1.5).dtype, dtypes.weakfloat)
        self.assertEqual(Tensor(True).dtype, dtypes.bool)
        self.assertEqual(Tensor(1).numpy().dtype, np.int32)
        self.assertEqual(Tensor(1.5).numpy().dtype, np.float32)

    def test_literals_adopt_the_tensor_dtype(self):
        for dt in (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int64, dtypes.float16, dtypes.float32):
            t = Tensor([1, 2, 3], dtype=dt)
            self.assertEqual((t + 1).dtype, dt)
            self.assertEqual((2 * t).dtype, dt)
        self.assertEqual((Tensor([1, 2]) * 0.5).dtype, dtypes.weakfloat)
        self.assertEqual((Tensor([1, 2]) * 0.5).numpy().tolist(), [0.5, 1.0])
        self.assertEqual(least_upper_dtype(dtypes.int8, dtypes.uint8), dtypes.int16)

    def test_default_float_decides_reads(self):
        with Context(DEFAULT_FLOAT="HALF"):
            self.assertEqual((Tensor([1, 2]) / 2).numpy().dtype, np.float16)

    def test_big_ints(self):
        self.assertEqual(Tensor([2**40]).dtype, dtypes.int64)
        self.assertEqual(Tensor([2**40]).tolist(), [2**40])
        with self.assertRaises(OverflowError):
            Tensor([1, 2], dtype=dtypes.int8) + 1000


class TestDeviceLess(unittest.TestCase):
    def test_device_less(self):
        self.assertIsNone(Tensor(3).device)
        self.assertIsNone(Tensor.arange(3).device)
        x = Tensor([1.0, 2.0, 3.0], device=f"{Device.DEFAULT}:1")
        self.assertEqual((x + Tensor.arange(3)).device, x.device)
        self.assertEqual((x + Tensor.arange(3)).tolist(), [1.0, 3.0, 5.0])


class TestWrites(unittest.TestCase):
    def test_assign(self):
        a = Tensor.zeros(4).contiguous().realize()
        a += 1
        a.assign(a * 3)
        self.assertEqual(a.tolist(), [3.0] * 4)
        with self.assertRaises(RuntimeError):
            a.assign(Tensor.zeros(4, dtype=dtypes.int32))

    def test_setitem(self):
        a = Tensor.zeros(3, 3).contiguous()
        a[1] = 5
        a[:, 2] = Tensor([7.0, 8.0, 9.0])
        np.testing.assert_equal(a.numpy(), [[0, 0, 7], [5, 5, 8], [0, 0, 9]])

    def test_gradient_shapes(self):
        x = Tensor([[1.0, 2.0], [3.0, 4.0]])
        (g,) = (x * x).sum().gradient(x)
        self.assertEqual(g.shape, x.shape)
        np.testing.assert_allclose(g.numpy(), 2 * x.numpy())


if __name__ == "__main__":
    unittest.main()
