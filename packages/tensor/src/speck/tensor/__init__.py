"""speck.tensor: the user-facing lazy Tensor, its scheduler (tensor graph -> kernels) and realize engine.

from speck.tensor import Tensor
(Tensor([1, 2, 3]) * 2).tolist()   # [2, 4, 6]
"""

from speck.tensor._siblings import check_sibling_versions

check_sibling_versions()

from speck.tensor import helpers  # noqa: E402  (defines every setting, so Context knows them all)
from speck.tensor import profile as _profile  # noqa: E402, F401  (writes the trace at exit under PROFILE=<path>)
from speck.tensor._version import __version__  # noqa: E402
from speck.tensor.compat import install_alias_finder  # noqa: E402
from speck.tensor.counters import GlobalCounters  # noqa: E402
from speck.tensor.device import Device  # noqa: E402
from speck.tensor.function import function  # noqa: E402
from speck.tensor.helpers import fetch, getenv  # noqa: E402
from speck.tensor.jit import TinyJit  # noqa: E402
from speck.tensor.schedule import KernelCountException, assert_kernel_count  # noqa: E402
from speck.tensor.settings import TRAINING  # noqa: E402
from speck.tensor.tensor import Tensor  # noqa: E402
from speck.tensor.uop.ops import Variable  # noqa: E402
from speck.tensor.usb import register as _register_usb  # noqa: E402
from speck.uop import Context, DType, UOp, dtypes  # noqa: E402

install_alias_finder()
_register_usb()  # the USB device kind, when speck-usbgpu is installed (also the speck.devices entry point)


__all__ = [
    "TRAINING", "Context", "DType", "Device", "GlobalCounters", "KernelCountException", "Tensor", "TinyJit", "UOp",
    "Variable", "__version__", "assert_kernel_count", "dtypes", "fetch", "function", "getenv", "helpers",
]  # fmt: skip
