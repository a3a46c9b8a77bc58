"""The Tensor class, for the modules that define its methods and build its results (elementwise, movement, reduce,
indexing, nnops, random, writes, multi, autograd, ...). tensor.py composes the class from those modules and
registers it here once it is built; they read it as `from speck.tensor.hook import Tensor` when called. So they
depend on this small module, not on tensor.py, which depends on them: no import cycle."""

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
