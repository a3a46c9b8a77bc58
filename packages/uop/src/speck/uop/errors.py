"""Exceptions speck.uop defines, under one base class. Most bad input to the IR raises the builtin class users
expect (RuntimeError for a malformed graph); the classes here are for errors a caller tells apart."""

from __future__ import annotations


class UOpError(Exception):
    """Base of every exception speck.uop defines (each also derives from the builtin class users catch)."""


class UnknownDTypeError(AttributeError, RuntimeError, UOpError):
    """An unknown dtype name: an AttributeError like a missing `dtypes.<name>` (tinygrad's lookup), and a
    RuntimeError like speck's other bad-argument errors."""
