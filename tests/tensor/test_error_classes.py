"""User-facing errors are caught two ways: by `except TensorError` (everything speck.tensor raises on purpose, bad
dtypes and devices included though a lower package found them) and by the builtin class the mistake calls for, so
code written against numpy, torch or tinygrad keeps working. Where speck raised RuntimeError before, the class is a
RuntimeError too."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from speck.hcq.errors import DeviceNotFoundError
from speck.tensor import Tensor
from speck.tensor.errors import TensorError
from speck.tensor.nn import Linear
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import safe_load, safe_save, torch_load
from speck.uop.errors import UnknownDTypeError


def _bad_safetensors(tmp: pathlib.Path) -> Any:
    path = tmp / "bad.safetensors"
    path.write_bytes((5).to_bytes(8, "little") + b"nope!")  # a 5-byte header that is not JSON
    return safe_load(path)


def _truncated_torch(tmp: pathlib.Path) -> Any:
    path = tmp / "bad.pth"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    return torch_load(path)


# (what, the builtin(s) it must also be, the mistake)
CASES: list[tuple[str, tuple[type[BaseException], ...], Callable[[pathlib.Path], Any]]] = [
    ("reshape to a different size", (ValueError, RuntimeError), lambda _: Tensor.ones(2, 3).reshape(4, 2)),
    ("reshape -1 next to a 0 dim", (ZeroDivisionError, ValueError), lambda _: Tensor.ones(0, 3).reshape(-1, 0)),
    ("two -1 in a reshape", (ValueError, RuntimeError), lambda _: Tensor.ones(2, 3).reshape(-1, -1)),
    ("permute repeating a dim", (ValueError, RuntimeError), lambda _: Tensor.ones(2, 3).permute(0, 0)),
    ("matmul inner dims", (ValueError, RuntimeError), lambda _: Tensor.ones(2, 3) @ Tensor.ones(2, 3)),
    ("shapes that don't broadcast", (IndexError,), lambda _: Tensor.ones(2, 3) + Tensor.ones(4, 3)),
    ("unknown dtype name", (AttributeError, RuntimeError, UnknownDTypeError), lambda _: Tensor([1]).cast("nope")),
    ("numpy dtype without a speck one", (AttributeError,), lambda _: Tensor([1], dtype=np.str_)),
    ("numpy array of strings", (TypeError, RuntimeError), lambda _: Tensor(np.array(["a"]))),
    ("where on a float condition", (TypeError, RuntimeError), lambda _: Tensor.ones(2).where(1, 2)),
    ("unknown device", (KeyError, RuntimeError, DeviceNotFoundError), lambda _: Tensor([1], device="NOPE")),
    ("to an unknown device", (KeyError, DeviceNotFoundError), lambda _: Tensor([1]).to("NOPE:3")),
    ("index out of range", (IndexError, RuntimeError), lambda _: Tensor([1, 2])[5]),
    ("too many indices", (IndexError,), lambda _: Tensor.ones(2, 2)[0, 0, 0]),
    ("dim out of range", (IndexError,), lambda _: Tensor.ones(2, 3).sum(5)),
    ("a float axis", (TypeError,), lambda _: Tensor.ones(2, 3).sum(1.5)),
    ("cast to None", (TypeError,), lambda _: Tensor.ones(2).cast(None)),
    ("missing file", (FileNotFoundError,), lambda tmp: Tensor(tmp / "nothere")),
    ("safe_load of a missing file", (FileNotFoundError,), lambda tmp: safe_load(tmp / "nothere.safetensors")),
    ("torch_load of a missing file", (FileNotFoundError,), lambda tmp: torch_load(tmp / "nothere.pth")),
    ("malformed safetensors", (ValueError, RuntimeError), _bad_safetensors),
    ("malformed torch checkpoint", (ValueError, RuntimeError), _truncated_torch),
    ("bool floor division", (TypeError, RuntimeError), lambda _: Tensor([True]) // Tensor([True])),
    ("negative learning rate", (ValueError,), lambda _: SGD([Tensor.ones(2, requires_grad=True)], lr=-1.0)),
    ("an optimizer of non-tensors", (TypeError,), lambda _: SGD([1, 2])),
    ("a Linear of no inputs", (ValueError,), lambda _: Linear(-1, 2)),
    ("safe_save of a non-tensor", (TypeError,), lambda tmp: safe_save({"a": 1}, tmp / "a.safetensors")),
]


@pytest.mark.parametrize(("what", "builtins", "mistake"), CASES, ids=[c[0] for c in CASES])
def test_a_user_facing_error_is_a_tensor_error_and_its_builtin(
    what: str, builtins: tuple[type[BaseException], ...], mistake: Callable[[pathlib.Path], Any], tmp_path: pathlib.Path
) -> None:
    with pytest.raises(TensorError) as ei:
        out = mistake(tmp_path)
        if isinstance(out, Tensor):
            out.realize()
    for cls in builtins:
        assert isinstance(ei.value, cls), f"{what}: {type(ei.value).__mro__} is no {cls.__name__}"
    assert str(ei.value), f"{what}: an error without a message"


def test_existing_builtin_handlers_still_catch() -> None:
    """`except ValueError` written before the classes existed catches a bad reshape; `except KeyError` an unknown
    device; `except IndexError` an out-of-range index."""
    caught = []
    for cls, fn in (
        (ValueError, lambda: Tensor.ones(2, 3).reshape(5)),
        (KeyError, lambda: Tensor([1], device="NOPE")),
        (IndexError, lambda: Tensor([1])[3]),
    ):
        try:
            fn()
        except cls as e:
            caught.append(type(e).__name__)
    assert caught == ["TensorValueError", "UnknownDeviceError", "TensorIndexError"]
