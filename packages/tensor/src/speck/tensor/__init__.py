"""speck.tensor: the user-facing lazy Tensor, its scheduler (tensor graph -> kernels) and realize engine.

from speck.tensor import Tensor
(Tensor([1, 2, 3]) * 2).tolist()   # [2, 4, 6]
"""

from speck.tensor._siblings import check_sibling_versions

check_sibling_versions()

from speck.tensor._version import __version__  # noqa: E402
from speck.tensor.autograd import TRAINING  # noqa: E402  (defines the TRAINING setting for Context)
from speck.tensor.device import Device  # noqa: E402
from speck.tensor.jit import TinyJit  # noqa: E402
from speck.tensor.realize import GlobalCounters  # noqa: E402
from speck.tensor.schedule import KernelCountException, assert_kernel_count  # noqa: E402
from speck.tensor.tensor import Tensor  # noqa: E402
from speck.uop import Context, DType, dtypes  # noqa: E402
from speck.uop import UOp as _UOp  # noqa: E402


def Variable(name: str, min_val: int, max_val: int) -> _UOp:
    """A symbolic size in [min_val, max_val]; `.bind(v)` gives a bound value usable as a reshape/shrink dim."""
    return _UOp.variable(name, min_val, max_val)


__all__ = [
    "TRAINING", "Context", "DType", "Device", "GlobalCounters", "KernelCountException", "Tensor", "TinyJit", "Variable",
    "__version__",
    "assert_kernel_count", "dtypes",
]  # fmt: skip
