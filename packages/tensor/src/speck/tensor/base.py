"""`TensorBase`: the type every Tensor is an instance of, defined below the op layer. Modules that tensor.py imports
(and so cannot import it back) recognise tensors among arbitrary values with `isinstance(x, TensorBase)`, and make
new ones with the class of a tensor at hand (`type(t)`)."""

from __future__ import annotations


class TensorBase:
    """Base of speck.tensor.Tensor; no state and no methods of its own."""

    __slots__ = ()
