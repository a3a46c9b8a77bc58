"""The arithmetic, comparison and bitwise operators of `UOp` and its one-op ALU shorthands (exp2, sqrt, ...): every
one is `alu` with an op (C semantics for // and %), so they live apart from the node's construction and traversal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from speck.uop.dtype import ConstType, DType, dtypes
from speck.uop.ops import Ops

# The node class the operators build. UOp mixes them in as UOpOperators["UOp"]: a type parameter, so this module
# needs no import of the node it is part of.
Node = TypeVar("Node", bound="UOpOperators[Any]")


class UOpOperators(Generic[Node]):
    """Mixed into UOp (no state of its own)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what UOp provides
        dtype: DType

        def alu(self, op: Ops, *src: Node | ConstType) -> Node: ...

        def ufix(self, x: Node | ConstType) -> Node: ...

    def _ralu(self, op: Ops, x: ConstType) -> Node:
        """`x op self`, for the reflected operators."""
        return cast(Node, self.ufix(x).alu(op, self))

    def __add__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.ADD, x)

    def __radd__(self, x: ConstType) -> Node:
        return self._ralu(Ops.ADD, x)

    def __mul__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.MUL, x)

    def __rmul__(self, x: ConstType) -> Node:
        return self._ralu(Ops.MUL, x)

    def __neg__(self) -> Node:
        return self.logical_not() if self.dtype.scalar() == dtypes.bool else self * -1

    def __sub__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.ADD, -self.ufix(x))

    def __rsub__(self, x: ConstType) -> Node:
        return cast(Node, self.ufix(x) + (-self))

    def __truediv__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.FDIV, x)

    def __rtruediv__(self, x: ConstType) -> Node:
        return self._ralu(Ops.FDIV, x)

    def __floordiv__(self, x: Node | ConstType) -> Node:
        """Integer division truncating toward zero (C semantics: -7 // 2 is -3 here, unlike Python)."""
        return self.alu(Ops.CDIV, x)

    def __rfloordiv__(self, x: ConstType) -> Node:
        return self._ralu(Ops.CDIV, x)

    def __mod__(self, x: Node | ConstType) -> Node:
        """Remainder with the dividend's sign (C semantics: -7 % 2 is -1 here, unlike Python)."""
        return self.alu(Ops.CMOD, x)

    def __rmod__(self, x: ConstType) -> Node:
        return self._ralu(Ops.CMOD, x)

    def __lt__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.CMPLT, x)

    def __gt__(self, x: Node | ConstType) -> Node:
        return cast(Node, self.ufix(x).alu(Ops.CMPLT, self))

    def __le__(self, x: Node | ConstType) -> Node:
        return cast(Node, (self > x).logical_not())

    def __ge__(self, x: Node | ConstType) -> Node:
        return cast(Node, (self < x).logical_not())

    def __and__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.AND, x)

    def __rand__(self, x: ConstType) -> Node:
        return self._ralu(Ops.AND, x)

    def __or__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.OR, x)

    def __ror__(self, x: ConstType) -> Node:
        return self._ralu(Ops.OR, x)

    def __xor__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.XOR, x)

    def __rxor__(self, x: ConstType) -> Node:
        return self._ralu(Ops.XOR, x)

    def __lshift__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.SHL, x)

    def __rshift__(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.SHR, x)

    def __invert__(self) -> Node:
        return self.logical_not() if self.dtype.scalar() == dtypes.bool else self ^ -1

    def eq(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.CMPEQ, x)

    def ne(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.CMPNE, x)

    def logical_not(self) -> Node:
        return self.ne(True)

    def maximum(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.MAX, x)

    def minimum(self, x: Node | ConstType) -> Node:
        return cast(Node, -((-self).maximum(-self.ufix(x))))

    def exp2(self) -> Node:
        return self.alu(Ops.EXP2)

    def log2(self) -> Node:
        return self.alu(Ops.LOG2)

    def sin(self) -> Node:
        return self.alu(Ops.SIN)

    def sqrt(self) -> Node:
        return self.alu(Ops.SQRT)

    def reciprocal(self) -> Node:
        return self.alu(Ops.RECIPROCAL)

    def trunc(self) -> Node:
        return self.alu(Ops.TRUNC)

    def pow(self, x: Node | ConstType) -> Node:
        return self.alu(Ops.POW, x)
