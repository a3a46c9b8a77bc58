"""Every exception speck.uop raises on purpose, under one base class: `except UOpError` catches them all. Each also
derives from the builtin class users expect (ValueError for a bad value, IndexError for a bad index...) and, where
speck raised a RuntimeError before, from RuntimeError too, so code catching either keeps working."""

from __future__ import annotations

from typing import Any


def rebuild_error(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """Unpickle an exception without calling its __init__ (see reduce_error)."""
    solid: Any = cls  # the builtin base whose __new__ lays the instance out (OSError's for an OSError subclass)
    while solid.__module__ != "builtins":
        solid = solid.__base__
    exc: BaseException = solid.__new__(cls, *args)
    exc.args = args  # OSError.__new__ leaves them to __init__ when a subclass has its own
    return exc


def reduce_error(self: BaseException) -> tuple[Any, ...]:
    """Pickle an exception as its class, args and attributes. The default (class(*args)) calls __init__ with the
    formatted message, which breaks every class whose __init__ takes other parameters than its args."""
    return rebuild_error, (type(self), self.args), self.__dict__ or None


class UOpError(Exception):
    """Base of every exception speck.uop defines (each also derives from the builtin class users catch)."""

    __reduce__ = reduce_error


class UnknownDTypeError(AttributeError, RuntimeError, UOpError):
    """An unknown dtype name: an AttributeError like a missing `dtypes.<name>` (tinygrad's lookup), and a
    RuntimeError like speck's other bad-argument errors."""


class UOpValueError(ValueError, RuntimeError, UOpError):
    """A bad value for an argument of the IR's builders (a variable's bounds, a reduce op, a shape, a dtype that
    can't be vectorized): a ValueError, and a RuntimeError like speck's earlier errors."""


class UOpTypeError(TypeError, RuntimeError, UOpError):
    """An argument of the wrong kind (a UOp where a Python value belongs, a float literal for an int dtype)."""


class UOpIndexError(IndexError, RuntimeError, UOpError):
    """A buffer view indexed with the wrong number, kind or range of indices."""


class ImmutableError(AttributeError, UOpError):
    """An attribute set on an immutable object (a UOp, a DType): build a new one instead (an AttributeError, like a
    frozen dataclass's)."""


class SpecError(RuntimeError, UOpError):
    """A graph that breaks the UOp spec (type_verify); the message names the node and the rule."""


class RewriteLoopError(RuntimeError, UOpError):
    """graph_rewrite did not reach a fixed point (a rule, or two, keep rewriting a node); the message names the last
    rule applied."""


class UOpStateError(RuntimeError, UOpError):
    """An operation the IR can't do in its current state: a registry not filled yet (speck.uop only partly
    imported), a node that is not realized, a pickle naming something that is no longer a PatternMatcher."""


class SettingError(ValueError, RuntimeError, UOpError):
    """A setting declared twice or given a value it can't take (an environment variable of the wrong type, a DEV
    target that doesn't parse); the message names the setting and what it accepts."""


class SettingTypeError(TypeError, SettingError):
    """A value of the wrong kind for a setting (`Context(DEBUG="abc")`, a float for an int setting)."""


class UnknownSettingError(KeyError, SettingError):
    """A setting name that is not declared; the message lists the declared ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SettingAttributeError(AttributeError, SettingError):
    """A list setting naming something its namespace doesn't have (`EMULATED_DTYPES=long,nope`)."""
