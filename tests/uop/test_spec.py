"""type_verify with spec_tensor / spec_kernel / spec_program: well-formed graphs pass, malformed ones raise
RuntimeError naming the node and the rule."""

from __future__ import annotations

import pytest

from speck.uop import AxisType, Ops, UOp, dtypes
from speck.uop.spec import spec_kernel, spec_program, spec_tensor, type_verify

out = UOp.param(0, dtypes.float32.ptr(16))
inp = UOp.param(1, dtypes.float32.ptr(16))


def kernel_ast() -> UOp:
    r = UOp.range(16, 0, AxisType.GLOBAL)
    k = UOp.range(4, 1, AxisType.REDUCE)
    gated = inp.index((r + k).valid(r + k < 16)).load()
    acc = (gated * UOp.const(dtypes.float32, 2.0)).reduce(k, op=Ops.ADD)
    return UOp.sink(out.index(r).store(acc + UOp.const(dtypes.float32, 1.0)).end(r))


def program() -> UOp:
    i32 = dtypes.int32
    r = UOp.range(UOp.cconst(16, i32), 0, AxisType.GLOBAL, i32)
    v = inp.index(r, gate=r < UOp.cconst(8, i32)).load(UOp.cconst(0.0, dtypes.float32))
    return UOp.sink(out.index(r).store(v * UOp.cconst(2.0, dtypes.float32)).end(r))


def test_good_graphs_pass() -> None:
    type_verify(kernel_ast(), spec_kernel)
    type_verify(program(), spec_program)
    b = UOp(
        Ops.BUFFER, dtypes.float32, (UOp(Ops.UNIQUE, dtypes.void, (), 0), UOp(Ops.DEVICE, dtypes.void, (), "CPU")), 12
    )
    t = b.reshape((3, 4)).permute((1, 0)).pad(((0, 1), (0, 0))).shrink(((0, 4), (1, 3))).reduce_axis(Ops.ADD, (0,))
    weak = UOp.const(dtypes.weakfloat, 2.0)
    type_verify(UOp.sink(t, UOp(Ops.COPY, dtypes.float32, (t, b.src[1])), weak), spec_tensor)
    type_verify(program().toposort(), spec_program)  # a linear list works too


@pytest.mark.parametrize(
    "bad,match",
    [
        (UOp(Ops.ADD, dtypes.float32, (UOp.const(dtypes.float32, 1.0),)), r"ADD .*rule 'alu'.*takes 2 source"),
        (UOp(Ops.ADD, dtypes.float32, (UOp.const(dtypes.float32, 1.0), UOp.const(dtypes.int32, 1))), "must all be"),
        (UOp(Ops.CMPLT, dtypes.int32, (UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 1))), "must produce bool"),
        (UOp(Ops.WHERE, dtypes.int32, (UOp.const(dtypes.int32, 1),) * 3), "condition must be bool"),
        (UOp(Ops.BITCAST, dtypes.int16, (UOp.const(dtypes.float32, 1.0),)), "must keep the size"),
        (UOp(Ops.STORE, dtypes.void, (out.index(UOp.const(dtypes.weakint, 0)), UOp.const(dtypes.int32, 1))),
         "element dtype"),
        (UOp(Ops.RANGE, dtypes.weakint, (UOp.const(dtypes.weakint, 4),), 3), "RANGE arg"),
    ],
)  # fmt: skip
def test_malformed_nodes_raise_naming_node_and_rule(bad: UOp, match: str) -> None:
    with pytest.raises(RuntimeError, match=match) as e:
        type_verify(UOp.sink(bad), spec_kernel)
    assert "type_verify: node" in str(e.value) and bad.op.name in str(e.value)


def test_movement_ops_are_not_kernel_or_program_ops() -> None:
    r = UOp(Ops.RESHAPE, dtypes.float32, (UOp.cconst(1.0, dtypes.float32),), (1,))
    for spec in (spec_kernel, spec_program):
        with pytest.raises(RuntimeError, match="RESHAPE.*no rule of this spec accepts"):
            type_verify(UOp.sink(r), spec)


def test_program_rejects_weak_and_bare_consts() -> None:
    w = UOp.variable("i", 0, 10)  # weakint
    with pytest.raises(RuntimeError, match="weak dtype"):
        type_verify(UOp.sink(out.index(w).store(UOp.cconst(1.0, dtypes.float32))), spec_program)
    bare = out.index(UOp.cconst(0, dtypes.int32)).store(UOp.const(dtypes.float32, 1.0))
    with pytest.raises(RuntimeError, match="inner CONST must be dtypes.weakfloat"):
        type_verify(UOp.sink(bare), spec_program)
    # the inner CONST of a casted const must carry exactly from_py(value)
    wrong = UOp(Ops.CAST, dtypes.float32, (UOp(Ops.CONST, dtypes.weakint, (), 1),))
    type_verify(UOp.sink(out.index(UOp.cconst(0, dtypes.int32)).store(wrong)), spec_program)  # int literal: fine
    float_in_int = UOp(Ops.CAST, dtypes.int32, (UOp(Ops.CONST, dtypes.weakfloat, (), 1.5),))
    with pytest.raises(RuntimeError, match="float literal"):
        type_verify(UOp.sink(out.index(float_in_int).store(UOp.cconst(1.0, dtypes.float32))), spec_program)
    # a weak const that is used bare (not under a CAST)
    lone = UOp(Ops.CONST, dtypes.weakint, (), 3)
    with pytest.raises(RuntimeError, match="must be casted"):
        type_verify(UOp.sink(lone), spec_program)


def test_program_shrink_of_a_buffer_takes_a_casted_literal_length() -> None:
    view = UOp(Ops.SHRINK, out.dtype, (out, UOp.cconst(4, dtypes.int32), UOp.cconst(8, dtypes.int32)))
    type_verify(UOp.sink(view.index(UOp.cconst(0, dtypes.int32)).store(UOp.cconst(1.0, dtypes.float32))), spec_program)
    n = UOp.variable("n", 1, 8, dtypes.int32)
    bad = UOp(Ops.SHRINK, out.dtype, (out, UOp.cconst(4, dtypes.int32), n))
    with pytest.raises(RuntimeError, match="casted literal length"):
        type_verify(UOp.sink(bad.index(UOp.cconst(0, dtypes.int32)).store(UOp.cconst(1.0, dtypes.float32))),
                    spec_program)  # fmt: skip
