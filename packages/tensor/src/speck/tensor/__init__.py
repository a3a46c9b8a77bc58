"""speck.tensor: the user-facing lazy Tensor, its scheduler (tensor graph -> kernels) and realize engine.

from speck.tensor import Tensor
(Tensor([1, 2, 3]) * 2).tolist()   # [2, 4, 6]
"""

from speck.tensor._siblings import check_sibling_versions

check_sibling_versions()

from speck.tensor import helpers  # noqa: E402  (defines every setting, so Context knows them all)
from speck.tensor._version import __version__  # noqa: E402
from speck.tensor.compat import install_alias_finder  # noqa: E402
from speck.tensor.counters import GlobalCounters  # noqa: E402
from speck.tensor.device import Device  # noqa: E402
from speck.tensor.function import function  # noqa: E402
from speck.tensor.jit import TinyJit  # noqa: E402
from speck.tensor.schedule import KernelCountException, assert_kernel_count  # noqa: E402
from speck.tensor.settings import TRAINING  # noqa: E402
from speck.tensor.tensor import Tensor  # noqa: E402
from speck.tensor.usb import register as _register_usb  # noqa: E402
from speck.uop import Context, DType, UOp, dtypes  # noqa: E402

install_alias_finder()
_register_usb()  # the USB device kind, when speck-usbgpu is installed (also the speck.devices entry point)


def Variable(name: str, min_val: int, max_val: int) -> UOp:
    """A symbolic size in [min_val, max_val]; `.bind(v)` gives a bound value usable as a reshape/shrink dim."""
    return UOp.variable(name, min_val, max_val)


__all__ = [
    "TRAINING", "Context", "DType", "Device", "GlobalCounters", "KernelCountException", "Tensor", "TinyJit", "UOp",
    "Variable", "__version__", "assert_kernel_count", "dtypes", "function", "helpers",
]  # fmt: skip
