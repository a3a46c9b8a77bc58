"""The arithmetic, comparison and bitwise operators of `UOp` and its one-op ALU shorthands (exp2, sqrt, ...): every
one is `alu` with an op (C semantics for // and %), so they live apart from the node's construction and traversal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.uop.dtype import ConstType, DType, dtypes
from speck.uop.ops import Ops

if TYPE_CHECKING:
    from speck.uop.uop import UOp


class UOpOperators:
    """Mixed into UOp (no state of its own)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what UOp provides
        dtype: DType

        def alu(self, op: Ops, *src: UOp | ConstType) -> UOp: ...

        def ufix(self, x: UOp | ConstType) -> UOp: ...

    def __add__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.ADD, x)

    def __radd__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.ADD, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __mul__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.MUL, x)

    def __rmul__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.MUL, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __neg__(self) -> UOp:
        return self.logical_not() if self.dtype.scalar() == dtypes.bool else self * -1

    def __sub__(self, x: UOp | ConstType) -> UOp:
        return self + (-self.ufix(x))

    def __rsub__(self, x: ConstType) -> UOp:
        return self.ufix(x) + (-self)

    def __truediv__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.FDIV, x)

    def __rtruediv__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.FDIV, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __floordiv__(self, x: UOp | ConstType) -> UOp:
        """Integer division truncating toward zero (C semantics: -7 // 2 is -3 here, unlike Python)."""
        return self.alu(Ops.CDIV, x)

    def __rfloordiv__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.CDIV, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __mod__(self, x: UOp | ConstType) -> UOp:
        """Remainder with the dividend's sign (C semantics: -7 % 2 is -1 here, unlike Python)."""
        return self.alu(Ops.CMOD, x)

    def __rmod__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.CMOD, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __lt__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.CMPLT, x)

    def __gt__(self, x: UOp | ConstType) -> UOp:
        return self.ufix(x).alu(Ops.CMPLT, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __le__(self, x: UOp | ConstType) -> UOp:
        return (self > x).logical_not()

    def __ge__(self, x: UOp | ConstType) -> UOp:
        return (self < x).logical_not()

    def __and__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.AND, x)

    def __rand__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.AND, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __or__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.OR, x)

    def __ror__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.OR, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __xor__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.XOR, x)

    def __rxor__(self, x: ConstType) -> UOp:
        return self.ufix(x).alu(Ops.XOR, self)  # type: ignore[arg-type]  # (self is the UOp)

    def __lshift__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.SHL, x)

    def __rshift__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.SHR, x)

    def __invert__(self) -> UOp:
        return self.logical_not() if self.dtype.scalar() == dtypes.bool else self ^ -1

    def eq(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.CMPEQ, x)

    def ne(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.CMPNE, x)

    def logical_not(self) -> UOp:
        return self.ne(True)

    def maximum(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.MAX, x)

    def minimum(self, x: UOp | ConstType) -> UOp:
        return -((-self).maximum(-self.ufix(x)))

    def exp2(self) -> UOp:
        return self.alu(Ops.EXP2)

    def log2(self) -> UOp:
        return self.alu(Ops.LOG2)

    def sin(self) -> UOp:
        return self.alu(Ops.SIN)

    def sqrt(self) -> UOp:
        return self.alu(Ops.SQRT)

    def reciprocal(self) -> UOp:
        return self.alu(Ops.RECIPROCAL)

    def trunc(self) -> UOp:
        return self.alu(Ops.TRUNC)

    def pow(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.POW, x)
