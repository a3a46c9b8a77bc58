"""tinygrad's module layout and settings on speck.tensor: `tinygrad.X` imports resolve to speck.tensor's modules
(the same objects), every setting tinygrad users set exists, and Context scopes them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from speck.tensor import Context, Tensor, dtypes
from speck.tensor.helpers import ContextVar

ALIAS_SCRIPT = """
import sys, speck.tensor
sys.modules["tinygrad"] = speck.tensor  # the plainest aliasing a harness could do
from tinygrad import Tensor, TinyJit, Device, dtypes, Variable, GlobalCounters, Context, UOp
from tinygrad.tensor import Tensor as T2
from tinygrad.engine.jit import TinyJit as J2, JitError
from tinygrad.helpers import GlobalCounters as G2, getenv, DEBUG, JIT, CI
from tinygrad.dtype import DType, _to_np_dtype, least_upper_dtype
from tinygrad.device import Device as D2, is_dtype_supported
from tinygrad.uop.ops import UOp as U2, Ops
from tinygrad.nn.state import get_parameters
from tinygrad.nn.optim import Adam
import speck.tensor.tensor, speck.tensor.jit, speck.tensor.nn.state, tinygrad.nn.state
assert T2 is Tensor is speck.tensor.tensor.Tensor
assert J2 is TinyJit and JitError is speck.tensor.jit.JitError and G2 is GlobalCounters and D2 is Device
assert U2 is UOp and tinygrad.nn.state is speck.tensor.nn.state
print((Tensor([1, 2]) + 1).tolist())
"""


def test_tinygrad_module_names_resolve_to_the_same_speck_modules() -> None:
    proc = subprocess.run([sys.executable, "-c", ALIAS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[2, 3]"


def test_compat_runner_runs_a_tinygrad_script(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "user.py"
    script.write_text(
        "import sys\nfrom tinygrad import Tensor\nprint(Tensor([3.0]).exp().log().item(), sys.argv[1:])\n"
    )
    proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", str(script), "a", "b"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr  # runpy warns when the module run is one speck.tensor imports
    value, args = proc.stdout.strip().split(" ", 1)
    assert abs(float(value) - 3.0) < 1e-5 and args == "['a', 'b']"


def test_compat_runner_runs_pytest_and_code_like_python(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`-m module` (a test runner over tinygrad test files) and `-c code`, as `python` takes them."""
    test = tmp_path / "test_user.py"
    test.write_text(
        "from tinygrad import Tensor\n\ndef test_add():\n    assert (Tensor([1, 2]) + 1).tolist() == [2, 3]\n"
    )
    proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(test)], capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", "-c",
                           "import sys; from tinygrad import Tensor; print(Tensor([4]).tolist(), sys.argv[1:])", "x"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "[4] ['x']", proc.stderr
    proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", "-m"], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "usage" in proc.stderr


@pytest.mark.parametrize(
    "name",
    ["DEBUG", "BEAM", "NOOPT", "JIT", "CACHELEVEL", "DEV", "DEFAULT_FLOAT", "SPLIT_REDUCEOP", "TRAINING",
     "NUM_CPU_THREADS", "PROFILE", "TRANSCENDENTAL", "CAPTURING", "RING", "ALL2ALL"],
)  # fmt: skip
def test_every_setting_tinygrad_users_set_exists(name: str) -> None:
    cv = ContextVar.get(name)
    old = cv.value
    with Context(**{name: cv.value}):
        assert ContextVar.get(name).value == old


def test_unknown_setting_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="unknown setting 'NOT_A_SETTING'.*BEAM.*DEBUG"), Context(NOT_A_SETTING=1):
        pass


def test_context_restores_values_and_works_as_a_decorator() -> None:
    from speck.tensor.helpers import DEBUG

    before = DEBUG.value

    @Context(DEBUG=3)
    def inner() -> int:
        return int(DEBUG.value)

    assert inner() == 3 and DEBUG.value == before
    with pytest.raises(ZeroDivisionError), Context(DEBUG=4):
        _ = 1 / 0
    assert DEBUG.value == before


def test_default_float_setting_is_read_live() -> None:
    with Context(DEFAULT_FLOAT="HALF"):
        assert dtypes.default_float == dtypes.float16
        t = Tensor([1.5, 2.25])
        assert t.dtype == dtypes.float16
        np.testing.assert_array_equal(t.numpy(), np.array([1.5, 2.25], np.float16))
    assert dtypes.default_float == dtypes.float32 and Tensor([1.5]).dtype == dtypes.float32
    with Context(DEFAULT_FLOAT="int32"), pytest.raises(ValueError, match="not a concrete float"):
        _ = dtypes.default_float


def test_noopt_disables_the_heuristic() -> None:
    from speck.codegen.opt import optimize_kernel
    from speck.hcq import Device

    a = Tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    ast = (a @ a).schedule()[-1].ast
    renderer = Device["CPU"].renderer
    with Context(NOOPT=1):
        unopt = optimize_kernel(ast, renderer)
    opt = optimize_kernel(ast, renderer)
    assert unopt is not opt  # the heuristic changes a matmul; NOOPT leaves it as merged


def test_compat_runner_help_and_a_missing_script() -> None:
    """--help prints the usage (exit 0); a script path that is no file is a one-line error with the usage, not a
    FileNotFoundError traceback (exit 1)."""
    ok = subprocess.run([sys.executable, "-m", "speck.tensor.compat", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("usage: python -m speck.tensor.compat")
    bad = subprocess.run([sys.executable, "-m", "speck.tensor.compat", "no_such_script.py"], capture_output=True,
                         text=True)  # fmt: skip
    assert bad.returncode == 1 and "no script 'no_such_script.py'" in bad.stderr and "Traceback" not in bad.stderr
