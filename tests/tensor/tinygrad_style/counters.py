"""A tinygrad-style test module (run through the alias by tests/tensor/test_parity_import_surface.py): memory and
work counters as multi-device test files read them - on NULL devices, with the settings imported from
tinygrad.helpers, and the program estimates of a lowered schedule item."""

import gc
import unittest

from tinygrad import Device, GlobalCounters, Tensor, dtypes
from tinygrad.engine.realize import lower_schedule_item
from tinygrad.helpers import CCACHE, JITBEAM, SCACHE, Context

PAIR = ("NULL:1", "NULL:2")


def _sync() -> None:
    for d in ("NULL", *PAIR):
        Device[d].synchronize()
    gc.collect()


class TestRam(unittest.TestCase):
    def setUp(self):
        self.enterContext(Context(DEV="NULL"))
        _sync()
        self.base, self.base_dev = GlobalCounters.mem_used, dict(GlobalCounters.mem_used_per_device)

    def used(self, dev=None):
        _sync()
        if dev is None:
            return GlobalCounters.mem_used - self.base
        return GlobalCounters.mem_used_per_device.get(dev, 0) - self.base_dev.get(dev, 0)

    def test_realize_and_free(self):
        x = Tensor.full((50, 40), 2.0).contiguous().realize()
        self.assertEqual(self.used(), 50 * 40 * 4)
        del x
        self.assertEqual(self.used(), 0)

    def test_replicate_frees_the_source(self):
        x = Tensor.full((50, 40), 2.0).contiguous().to(PAIR).realize()
        self.assertEqual(self.used(), 2 * 50 * 40 * 4)
        self.assertEqual([self.used(d) for d in PAIR], [50 * 40 * 4] * 2)
        del x
        self.assertEqual(self.used(), 0)

    def test_shard_splits_memory(self):
        for devs in (PAIR, ("NULL", "NULL:1")):
            x = Tensor.full((50, 40), 2.0).contiguous().shard(devs, axis=0).realize()
            self.assertEqual(self.used(), 50 * 40 * 4)
            self.assertEqual([self.used(d) for d in devs], [25 * 40 * 4] * 2)
            del x
            self.assertEqual(self.used(), 0)
            self.assertTrue(all(v >= 0 for v in GlobalCounters.mem_used_per_device.values()))

    def test_shard_in_place_replicates(self):
        x = Tensor.full((64,), 1.0).contiguous().realize()
        x.shard_(PAIR).realize()
        self.assertEqual(self.used(), 2 * 64 * 4)

    def test_settings_are_importable_and_settable(self):
        with Context(SCACHE=0, CCACHE=0, JITBEAM=0):
            self.assertEqual((SCACHE.value, CCACHE.value, JITBEAM.value), (0, 0, 0))
            (Tensor.full((4,), 1.0, device="NULL") + 1).realize()


class TestShardedWork(unittest.TestCase):
    def test_half_moves_half_the_memory(self):
        mem = {}
        for dt in (dtypes.float, dtypes.half):
            devs = ("NULL", "NULL:1")
            a = Tensor.empty(32, 32, dtype=dt, device="NULL").shard(devs, axis=0)  # (each shard a view of a)
            b = Tensor.empty(32, 32, dtype=dt, device="NULL").shard(devs, axis=None)
            GlobalCounters.reset()
            (a @ b).realize()
            mem[dt] = GlobalCounters.global_mem
        self.assertEqual(mem[dtypes.half] * 2, mem[dtypes.float])


class TestEstimates(unittest.TestCase):
    def mem(self, t):
        return lower_schedule_item(t.schedule()[-1]).prg.estimates.mem

    def test_elementwise(self):
        a, b = Tensor.empty(128, 64, dtype=dtypes.uint8), Tensor.empty(128, 64, dtype=dtypes.uint8)
        self.assertEqual(self.mem(a * b), 128 * 64 * 3)
        self.assertEqual(self.mem(a - 1), 128 * 64 * 2)
        self.assertEqual(self.mem(a * a), 128 * 64 * 2)

    def test_reduce_and_matmul(self):
        self.assertEqual(self.mem(Tensor.empty(32, 32).max()), 32 * 32 * 4 + 4)
        self.assertEqual(self.mem(Tensor.empty(32, 16) @ Tensor.empty(16, 8)), (32 * 16 + 16 * 8 + 32 * 8) * 4)

    def test_matmul_ops(self):
        GlobalCounters.reset()
        (Tensor.empty(8, 24) @ Tensor.empty(24, 16)).realize()
        self.assertEqual(GlobalCounters.global_ops, 8 * 24 * 16 * 2)


if __name__ == "__main__":
    unittest.main()
