"""Polynomial approximations of exp2, log2 and sin for renderers without them (filled in below)."""

from __future__ import annotations

from speck.uop import UOp


def exp2(x: UOp) -> UOp:
    raise NotImplementedError


def log2(x: UOp) -> UOp:
    raise NotImplementedError


def sin(x: UOp) -> UOp:
    raise NotImplementedError


def pow_via_exp2(x: UOp, y: UOp) -> UOp:
    raise NotImplementedError
