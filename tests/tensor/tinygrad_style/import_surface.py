"""A tinygrad-style test module (run through the alias by tests/tensor/test_parity_import_surface.py, never
collected directly): like tinygrad's own test files it reads the §1 names at import time, at module top, and branches
on them before any test body runs. Each test then checks one name's behaviour."""

import math
import unittest

import numpy as np
from tinygrad import Device, Tensor, UOp, Variable, dtypes, nn
from tinygrad.dtype import (
    float_to_bf16,
    float_to_fp16,
    from_storage_scalar,
    storage_fmt_for_dtype,
    strong_dtype,
    to_storage_scalar,
    truncate_bf16,
    truncate_fp16,
    weak_dtype,
)
from tinygrad.helpers import DEV, EMULATED_DTYPES, Context, Target
from tinygrad.renderer import Renderer
from tinygrad.uop.ops import Ops

# the import-time reads test files make (they must never raise for an unset DEV)
IS_LLVM = DEV.renderer == "LLVM"
IS_MOCK = DEV.interface.startswith("MOCK")
NO_ARCH = DEV.arch == ""
ON_CPU = Device.DEFAULT.split(":")[0] == "CPU" and DEV.device in ("", "CPU")
NATIVE_SQRT = Ops.SQRT in Device[Device.DEFAULT].renderer.code_for_op
EMULATED = EMULATED_DTYPES.tolist(dtypes)


class TestDEV(unittest.TestCase):
    def test_unset_dev_reads_empty_fields(self):
        with Context(DEV=""):
            self.assertEqual(DEV.value, [Target()])
            for f in ("device", "renderer", "arch", "interface", "indices"):
                self.assertEqual(getattr(DEV, f), "")
        self.assertFalse(IS_MOCK)

    def test_value_is_a_list_of_targets_and_attributes_read_the_first(self):
        with Context(DEV="MOCK:3+amd:llvm:gfx1100;CPU:X86"):
            self.assertEqual(len(DEV.value), 2)
            self.assertTrue(all(isinstance(t, Target) for t in DEV.value))
            self.assertEqual(
                (DEV.device, DEV.renderer, DEV.arch, DEV.interface, DEV.indices),
                ("AMD", "LLVM", "gfx1100", "MOCK", "3"),
            )
            self.assertEqual(repr(DEV), "MOCK:3+AMD:LLVM:gfx1100;CPU:X86")

    def test_target_for_a_device_type(self):
        with Context(DEV="NV:CUDA:sm_70;:LLVM"):
            self.assertEqual(DEV.target("nv"), Target(device="NV", renderer="CUDA", arch="sm_70"))
            self.assertEqual(DEV.target("AMD", arch="gfx950"), Target(device="AMD", renderer="LLVM", arch="gfx950"))
        with Context(DEV="CPU"):
            self.assertEqual(DEV.target("AMD", renderer="LLVM"), Target(device="AMD", renderer="LLVM"))

    def test_assigning_a_target_or_a_list_reparses(self):
        old = DEV.value
        try:
            DEV.value = Target.parse("cpu:x86")
            self.assertEqual(DEV.value, [Target(device="CPU", renderer="X86")])
            self.assertEqual(Device.DEFAULT, "CPU:X86")
            DEV.value = ["null", Target(device="CPU")]
            self.assertEqual([t.device for t in DEV.value], ["NULL", "CPU"])
        finally:
            DEV.value = old

    def test_target_parse_repr_roundtrip_and_replacedefault(self):
        for text in (
            "CPU",
            "AMD:LLVM",
            "NV:CUDA:sm_70",
            "AMD::gfx950",
            "USB+AMD",
            "CPU:LLVM:x86_64,znver2",
            "PCI:0,1+AMD",
        ):
            self.assertEqual(repr(Target.parse(text)), text)
            self.assertEqual(Target.parse(repr(Target.parse(text))), Target.parse(text))
        t = Target.parse("AMD::gfx950").replacedefault(renderer="LLVM", arch="gfx1100")
        self.assertEqual((t.renderer, t.arch), ("LLVM", "gfx950"))
        with self.assertRaises(RuntimeError):
            Target.parse("A+B+CPU")
        with self.assertRaises(RuntimeError):
            Target.parse("CPU:LLVM:x:y")


class TestContextVarTolist(unittest.TestCase):
    def test_tolist(self):
        with Context(EMULATED_DTYPES="long,half"):
            self.assertEqual(EMULATED_DTYPES.tolist(), ["long", "half"])
            self.assertEqual(EMULATED_DTYPES.tolist(dtypes), [dtypes.long, dtypes.half])
        with Context(EMULATED_DTYPES=""):
            self.assertEqual(EMULATED_DTYPES.tolist(dtypes), [])
        self.assertIsInstance(EMULATED, list)


class TestDtypeHelpers(unittest.TestCase):
    def test_strong_and_weak(self):
        self.assertEqual(strong_dtype(dtypes.weakint), dtypes.default_int)
        self.assertEqual(strong_dtype(dtypes.weakfloat), dtypes.default_float)
        with Context(DEFAULT_FLOAT="HALF"):
            self.assertEqual(strong_dtype(dtypes.weakfloat), dtypes.half)
        self.assertEqual(strong_dtype(dtypes.int8), dtypes.int8)
        self.assertEqual(weak_dtype(dtypes.bfloat16), dtypes.weakfloat)
        self.assertEqual(weak_dtype(dtypes.uint16), dtypes.weakint)
        self.assertEqual(weak_dtype(dtypes.bool), dtypes.bool)

    def test_float_conversions_against_numpy(self):
        for x in (0.1, 1.0 / 3, 65504.0, 70000.0, -2.5e-8, math.inf, 1e39):
            with np.errstate(over="ignore"):
                want = float(np.float16(x))
            self.assertEqual(float_to_fp16(x), want)
            self.assertEqual(truncate_fp16(x), want)
        self.assertEqual(float_to_bf16(1.0 + 2**-8), 1.0)  # a tie rounds to even
        self.assertEqual(float_to_bf16(1.0 + 3 * 2**-8), 1.0 + 2**-6)
        self.assertEqual(truncate_bf16(math.inf), math.inf)
        self.assertTrue(math.isnan(float_to_bf16(math.nan)))

    def test_storage_scalars(self):
        self.assertEqual(storage_fmt_for_dtype(dtypes.bfloat16), "H")
        self.assertEqual(storage_fmt_for_dtype(dtypes.fp8e4m3), "B")
        self.assertEqual(storage_fmt_for_dtype(dtypes.float32), "f")
        self.assertEqual(to_storage_scalar(1.0, dtypes.bfloat16), 0x3F80)
        self.assertEqual(from_storage_scalar(0x3F80, dtypes.bfloat16), 1.0)
        self.assertEqual(to_storage_scalar(2.5, dtypes.float32), 2.5)
        self.assertEqual(from_storage_scalar(to_storage_scalar(448.0, dtypes.fp8e4m3), dtypes.fp8e4m3), 448.0)


class TestRenderer(unittest.TestCase):
    def test_code_for_op_and_device_on_every_renderer(self):
        for dev in ("CPU", "CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON"):
            r = Device[dev].renderer
            self.assertIsInstance(r, Renderer)
            self.assertEqual(r.device, dev.split(":")[0])
            self.assertIn(Ops.ADD, r.code_for_op)
            self.assertNotIn(Ops.SINK, r.code_for_op)
            self.assertEqual(set(r.code_for_op), set(r.supported_ops))
        self.assertIn(Ops.THREEFRY, Device["PYTHON"].renderer.code_for_op)
        self.assertNotIn(Ops.THREEFRY, Device["CPU:CLANG"].renderer.code_for_op)
        self.assertIsInstance(NATIVE_SQRT, bool)

    def test_renderer_target_names_device_renderer_and_arch(self):
        for dev, renderer in (("CPU:LLVM", "LLVM"), ("CPU:CLANG", "CLANG"), ("CPU:X86", "X86")):
            t = Device[dev].renderer.target
            self.assertIsInstance(t, Target)
            self.assertEqual((t.device, t.renderer), ("CPU", renderer))
            self.assertEqual(Target.parse(repr(t)), t)


class TestSignatures(unittest.TestCase):
    def test_uop_const(self):
        c = UOp.const(dtypes.float, 2.0)
        self.assertEqual((c.op, c.dtype, c.arg), (Ops.CONST, dtypes.float, 2.0))
        self.assertEqual(UOp.const(dtypes.int8, 200).arg, -56)
        with self.assertRaises(TypeError):
            UOp.const(dtypes.float)  # b is required
        t = Tensor(UOp.const(dtypes.int, 7, device="CPU", shape=(2, 3)))
        self.assertEqual(t.tolist(), [[7] * 3] * 2)

    def test_variable(self):
        v = Variable("i", 1, 10, dtype=dtypes.int32)
        self.assertEqual(v.dtype, dtypes.int32)
        with self.assertRaises(RuntimeError):
            Variable("k", 0, 2**40, dtypes.int32)

    def test_nonzero_size(self):
        a = np.array([[0, 3, 0], [4, 0, 5]], dtype=np.int32)
        want = np.argwhere(a)
        self.assertEqual(Tensor(a).nonzero().tolist(), want.tolist())
        self.assertEqual(Tensor(a).nonzero(size=2).tolist(), want[:2].tolist())
        self.assertEqual(Tensor(a).nonzero(size=5, fill_value=-1).tolist(), want.tolist() + [[-1, -1]] * 2)

    def test_masked_select_size(self):
        x, m = np.arange(6, dtype=np.float32), np.array([1, 0, 1, 1, 0, 1], dtype=bool)
        self.assertEqual(Tensor(x).masked_select(Tensor(m)).tolist(), x[m].tolist())
        self.assertEqual(Tensor(x).masked_select(Tensor(m), size=2).tolist(), x[m][:2].tolist())
        self.assertEqual(Tensor(x).masked_select(Tensor(m), size=6, fill_value=-1).tolist(), x[m].tolist() + [-1, -1])

    def test_pad_to_value(self):
        self.assertEqual(Tensor([[1, 2]]).pad_to((2, 3), value=7).tolist(), [[1, 2, 7], [7, 7, 7]])
        self.assertEqual(Tensor([[1.0]]).pad_to(None, 2).tolist(), [[1.0, 0.0]])


class TestNNSubmodules(unittest.TestCase):
    def test_optim_state_datasets_reachable_from_nn(self):
        # model code does `from tinygrad import nn` and then reads nn.optim.Adam, nn.state.get_parameters
        lin = nn.Linear(3, 2)
        params = nn.state.get_parameters(lin)
        self.assertEqual(len(params), 2)
        opt = nn.optim.SGD(params, lr=0.5)
        before = lin.weight.numpy().copy()
        with Tensor.train():
            opt.zero_grad()
            lin(Tensor.ones(1, 3)).sum().backward()
            opt.step()
        np.testing.assert_allclose(lin.weight.numpy(), before - 0.5, rtol=1e-6)
        self.assertTrue(callable(nn.datasets.mnist))


if __name__ == "__main__":
    unittest.main()
