"""Exception classes of bad Tensor arguments. tinygrad raises the builtin class named in TENSOR_API (ValueError for
a bad reshape, IndexError for shapes that don't broadcast, AssertionError for a bad cat...); speck's own errors have
always been RuntimeErrors. Each class here is both, so code written against either keeps catching what it expects."""

from __future__ import annotations


class TensorValueError(ValueError, RuntimeError):
    """A bad value for an argument (reshape size, shrink bounds, pad amounts, rand bounds...)."""


class TensorIndexError(IndexError, RuntimeError):
    """A dim, index or shape that is out of range or doesn't broadcast."""


class TensorAssertionError(AssertionError, RuntimeError):
    """A violated precondition that tinygrad checks with `assert` (cat shapes, item() of several elements...)."""


class TensorTypeError(TypeError, RuntimeError):
    """An argument of the wrong kind (non-int randint bounds, a float Embedding index...)."""


class TensorOverflowError(OverflowError, RuntimeError):
    """A value that doesn't fit the requested dtype (an arange range beyond it)."""


class TensorNotImplementedError(NotImplementedError):
    """A mode tinygrad doesn't implement (NotImplementedError is already a RuntimeError)."""


class JitError(RuntimeError):
    """A jitted function was called in a way its capture can't serve, or did something a capture can't record."""


class JitResetError(JitError, AssertionError):
    """reset() of a TinyJit that has no function (an unpickled capture): it could never capture again."""
