"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): parity
round 8 as user code meets it - TinyJit's optimize= keyword, Tensor.kernelize, the older leakyrelu/pad2d names,
ops whose operands sit on two devices, computing on a DISK tensor, and the KeyErrors of unsupported dtypes."""

import os
import tempfile
import unittest

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.nn.state import safe_save

DEVS = (Device.DEFAULT, f"{Device.DEFAULT}:1")


class TestJitKeywords(unittest.TestCase):
    def test_optimize(self):
        @TinyJit(optimize=True)
        def f(x):
            return (x * 3).realize()

        for i in range(4):
            a = np.full(4, i, np.float32)
            np.testing.assert_allclose(f(Tensor(a)).numpy(), a * 3)
        self.assertIsNotNone(f.captured)

    def test_prune_and_optimize(self):
        w = Tensor([1.0, 2.0]).contiguous().realize()
        f = TinyJit(lambda x: (x + w * 2).realize(), prune=True, optimize=True)
        for i in range(4):
            out = f(Tensor([float(i), 0.0]).contiguous().realize())
        self.assertEqual(out.tolist(), [3.0 + 2.0, 4.0])


class TestKernelize(unittest.TestCase):
    def test_kernelize_then_realize(self):
        a = Tensor.arange(6).reshape(2, 3).float().clone()
        b = (a * 2).sum(axis=1)
        self.assertIs(b.kernelize(), b)
        np.testing.assert_allclose(b.numpy(), np.arange(6).reshape(2, 3).sum(axis=1) * 2)

    def test_kernelize_many(self):
        a, b = Tensor([1.0, 2.0]) + 1, Tensor([3.0]) * 2
        Tensor.kernelize(a, b)
        self.assertEqual((a.tolist(), b.tolist()), ([2.0, 3.0], [6.0]))


class TestOldNames(unittest.TestCase):
    def test_leakyrelu(self):
        x = np.array([-2.0, -0.5, 0.0, 1.5], np.float32)
        np.testing.assert_allclose(Tensor(x).leakyrelu(0.1).numpy(), np.where(x > 0, x, 0.1 * x), rtol=1e-6)

    def test_pad2d(self):
        x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
        np.testing.assert_array_equal(Tensor(x).pad2d((1, 1, 2, 0)).numpy(), np.pad(x, ((0, 0), (2, 0), (1, 1))))


class TestTwoDevices(unittest.TestCase):
    def test_binary_op(self):
        a = Tensor.ones(4, device=DEVS[0]).contiguous().realize()
        b = Tensor.ones(4, device=DEVS[1]).contiguous().realize()
        with self.assertRaisesRegex(RuntimeError, "two devices"):
            (a + b).realize()
        with self.assertRaisesRegex(RuntimeError, "two devices"):
            (a * b.reshape(1, 4)).realize()
        self.assertEqual((a + b.to(DEVS[0])).tolist(), [2.0] * 4)


class TestDiskCompute(unittest.TestCase):
    def test_compute_on_disk_asserts(self):
        with tempfile.TemporaryDirectory() as d:
            fn = os.path.join(d, "w.bin")
            with open(fn, "wb") as f:
                f.write(bytes([5, 6, 7]))
            t = Tensor.empty(3, dtype=dtypes.uint8, device=f"disk:{fn}")
            with self.assertRaises(AssertionError):
                (t + 1).realize()
            self.assertEqual((t.to(Device.DEFAULT) + 1).tolist(), [6, 7, 8])


class TestKeyErrors(unittest.TestCase):
    def test_complex_numpy(self):
        with self.assertRaises(KeyError):
            Tensor(np.array([1 + 2j]))

    def test_safe_save_fnuz(self):
        with tempfile.TemporaryDirectory() as d, self.assertRaises(KeyError):
            safe_save({"w": Tensor([1.0], dtype=dtypes.fp8e4m3fnuz)}, os.path.join(d, "w.safetensors"))


if __name__ == "__main__":
    unittest.main()
