"""The Tensor class for the few functions below tensor.py that build tensors with no tensor at hand to take the
class from (pickle's loaders, the scatter gradient rule, the write queue, realize's UOp.shard service): tensor.py
registers the class here once it is built, and they read it as `from speck.tensor.hook import Tensor` when called.
Everything else takes the class from the tensor it is handed (`type(t)`, a constructor classmethod's `cls`) and
recognises tensors with `isinstance(x, speck.tensor.base.TensorBase)`; tests/integration/test_design.py holds the
list of readers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from speck.tensor.errors import TensorImportError

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor as Tensor


def register(cls: type) -> None:
    """Make cls the Tensor class the method modules build results with (tensor.py, once). It becomes a plain module
    attribute, so reading it costs what any import of a name costs (these imports run on every op)."""
    globals()["Tensor"] = cls


def __getattr__(name: str) -> Any:  # only reached before register()
    if name == "Tensor":
        raise TensorImportError("speck.tensor.hook: no Tensor class registered yet; import speck.tensor (tensor.py "
                                "registers it) before calling a Tensor method module")  # fmt: skip
    raise AttributeError(f"module 'speck.tensor.hook' has no attribute {name!r}")
