"""UOp: hash-consing, constructors, STACK.index folding, casted consts, shape validation, bounds, traversals,
rendering and pickling, and the no-recursion guarantee on 100k-node chains."""

from __future__ import annotations

import gc
import pickle

import pytest

from speck.uop import AxisType, Invalid, Ops, UOp, dtypes, resolve, ssimplify, validate_shape


def test_hash_consing() -> None:
    x = UOp.variable("x", 0, 10)
    assert x + 1 is x + 1
    assert UOp.const(dtypes.float32, 0.0) is UOp.const(dtypes.float32, 0.0)
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, float("nan"))
    assert UOp(Ops.CONST, dtypes.weakint, (), 1) is not UOp(Ops.CONST, dtypes.weakint, (), True)
    assert (x + 1).replace(tag=1) is not x + 1 and (x + 1).replace(tag=1) is (x + 1).replace(tag=1)


def test_immutable() -> None:
    x = UOp.variable("x", 0, 10)
    with pytest.raises(AttributeError, match="immutable"):
        x.arg = 3  # type: ignore[misc]


def test_stack_index_folds_at_construction() -> None:
    a, b = UOp.variable("a", 0, 1), UOp.variable("b", 0, 1)
    s = UOp.stack(a, b)
    assert s.index(1) is b and s.index(0) is a
    assert s.index(UOp.const(dtypes.weakint, 1)) is b
    assert UOp.const(dtypes.int32, (4, 5)).index(1) is UOp.const(dtypes.int32, 5)
    assert UOp.const(dtypes.int32, (4, 5)).op is Ops.STACK


def test_cconst() -> None:
    c = UOp.cconst(3, dtypes.int32)
    assert c.op is Ops.CAST and c.dtype is dtypes.int32
    assert c.src[0].op is Ops.CONST and c.src[0].dtype is dtypes.weakint and c.src[0].arg == 3
    f = UOp.cconst(1.5, dtypes.float16)
    assert f.src[0].dtype is dtypes.weakfloat and f.src[0].arg == 1.5
    assert UOp.cconst(True, dtypes.bool).src[0].dtype is dtypes.bool
    assert UOp.cconst(2, dtypes.float32).src[0].arg == 2.0  # a float literal for a float dtype
    with pytest.raises(RuntimeError, match="float literal"):
        UOp.cconst(1.5, dtypes.int32)
    assert c.simplify() is UOp.const(dtypes.int32, 3)


def test_const_truncates_to_dtype() -> None:
    assert UOp.const(dtypes.int8, 200).arg == -56
    assert UOp.const(dtypes.uint8, -1).arg == 255
    assert UOp.const(dtypes.float16, 1e6).arg == float("inf")
    assert UOp.const(dtypes.weakint, Invalid).arg is Invalid


@pytest.mark.parametrize("bad", [2.0, "2", None, True, 1.5])
def test_shape_must_be_int(bad: object) -> None:
    x = UOp(Ops.BUFFER, dtypes.float32, (), 8)
    with pytest.raises(RuntimeError, match="shape must be int"):
        x.reshape((bad, 4))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="shape must be int"):
        validate_shape((2, bad))
    with pytest.raises(RuntimeError, match="shape must be int"):
        validate_shape((UOp.const(dtypes.float32, 2.0),))


def test_shapes() -> None:
    n = UOp.variable("n", 1, 16)
    x = UOp(Ops.BUFFER, dtypes.float32, (), 24)
    assert x.shape == (24,)
    y = x.reshape((2, 3, 4))
    assert y.shape == (2, 3, 4)
    assert y.permute((2, 0, 1)).shape == (4, 2, 3)
    assert y.pad(((1, 1), (0, 0), (0, 2))).shape == (4, 3, 6)
    assert y.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
    assert y.reduce_axis(Ops.ADD, (1,)).shape == (2, 1, 4)
    assert x.reshape((n,)).shape == (n,)


def test_simplify_is_canonical() -> None:
    v = UOp.variable("v", 0, 100)
    assert (v + 2 + 4).simplify() is (v + 6).simplify()
    assert (2 + v + 4).simplify() is (v + 6).simplify()
    assert (v * 2 * 3).simplify() is (v * 6).simplify()
    assert (v + v).simplify() is (v * 2).simplify()


def test_bounds() -> None:
    x, y = UOp.variable("x", -3, 10), UOp.variable("y", 2, 5)
    assert ((x + y).vmin, (x + y).vmax) == (-1, 15)
    assert ((x * y).vmin, (x * y).vmax) == (-15, 50)
    assert ((x // 3).vmin, (x // 3).vmax) == (-1, 3)
    assert ((x.maximum(y)).vmin, (x.maximum(y)).vmax) == (2, 10)
    assert (x < 11).vmin is True and (y < 2).vmax is False
    r = UOp.range(8, 0)
    assert (r.vmin, r.vmax) == (0, 7)
    i8 = UOp.variable("z", 100, 120, dtypes.int8)
    assert ((i8 + i8).vmin, (i8 + i8).vmax) == (-128, 127)  # may wrap: the dtype's whole range
    assert resolve(x < 11) and not resolve(y < 2) and resolve(x < 5, default=False) is False


def test_toposort_substitute_variables_render() -> None:
    a, b = UOp.variable("a", 0, 9), UOp.variable("b", 0, 9)
    e = (a * 10 + b) // 3
    order = e.toposort()
    assert order[-1] is e and all(order.index(s) < order.index(u) for u in order for s in u.src)
    assert e.variables() == [a, b]
    c = UOp.variable("c", 0, 9)
    assert e.substitute({b: c}) is (a * 10 + c) // 3
    assert e.render(simplify=False) == "(((a*10)+b)//3)"
    assert ssimplify(UOp.const(dtypes.weakint, 3) + 4) == 7
    assert (UOp.range(4, 1, AxisType.LOOP) + 1).render(simplify=False) == "(r1+1)"


def test_pickle_round_trip_keeps_identity() -> None:
    a = UOp.variable("a", 0, 9)
    e = UOp.sink((a * 3 + UOp.const(dtypes.weakint, Invalid)).eq(2), UOp.const(dtypes.float32, float("nan")))
    assert pickle.loads(pickle.dumps(e)) is e


def test_bind() -> None:
    v = UOp.variable("v", 1, 10)
    bv = v.bind(4)
    assert bv.unbind() == (v, 4) and bv.val == 4
    # a bound Variable stands for every value of its range (a kernel built with it serves each later binding, as
    # tinygrad's BIND does): its bounds are the range, not the value bound now
    assert (bv.vmin, bv.vmax) == (1, 10) and ((bv * 2 + 1).vmin, (bv * 2 + 1).vmax) == (3, 21)
    assert (bv < 5).simplify() is not UOp.const(dtypes.bool, True)
    with pytest.raises(RuntimeError, match="outside its bounds"):
        v.bind(11)


def test_uop_has_no_truth_value() -> None:
    with pytest.raises(RuntimeError, match="no truth value"):
        bool(UOp.variable("v", 0, 1) < 1)


@pytest.mark.slow
def test_100k_chain_no_recursion_error() -> None:
    v = UOp.variable("v", 0, 10)
    x = v
    for _ in range(100_000):
        x = x + 1
    assert len(x.toposort()) == 100_002
    assert x.vmax == 100_010
    assert x.simplify() is v + 100_000
    assert x.render(simplify=False).count("+1") == 100_000
    w = UOp.variable("w", 0, 1)
    assert x.substitute({v: w}).toposort()[0] is w
    assert pickle.loads(pickle.dumps(x)) is x
    del x
    gc.collect()


def test_readme_tour_runs() -> None:
    import pathlib
    import re

    readme = pathlib.Path(__file__).parents[2] / "packages" / "uop" / "README.md"
    m = re.search(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert m is not None, "the package README lost its API tour"
    exec(compile(m.group(1), str(readme), "exec"), {})


def test_variable_bounds_must_fit_the_dtype() -> None:
    with pytest.raises(RuntimeError, match="don't fit dtypes.char "):
        UOp.variable("v", -129, 0, dtypes.int8)
    with pytest.raises(RuntimeError, match="min <= max"):
        UOp.variable("v", 3, 2)
    assert UOp.variable("v", -(2**80), 2**80).vmax == 2**80  # weak ints are unbounded


# Known-answer vectors of Threefry-2x32-20 published with Random123 (kat_vectors): counter (x0, x1), key (k0, k1)
# -> (y0, y1), 32-bit words
THREEFRY_KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("ctr,key,want", THREEFRY_KAT)
def test_threefry_known_answers(ctr: tuple[int, int], key: tuple[int, int], want: tuple[int, int]) -> None:
    """THREEFRY's one definition (speck.uop.alu) and constant folding of an Ops.THREEFRY node give the published
    outputs (64-bit values hold the low word in their low 32 bits)."""
    from speck.uop import exec_alu
    from speck.uop.alu import threefry2x32

    x, k, y = ctr[0] | ctr[1] << 32, key[0] | key[1] << 32, want[0] | want[1] << 32
    assert threefry2x32(x, k) == y
    assert exec_alu(Ops.THREEFRY, dtypes.uint64, [x, k]) == y
    folded = UOp.const(dtypes.uint64, x).threefry(UOp.const(dtypes.uint64, k)).simplify()
    assert folded.op is Ops.CONST and folded.arg == y


def test_a_condition_its_bounds_decide_has_that_truth_value() -> None:
    v = UOp.variable("v", 1, 8)
    assert bool(v > 0) and not bool(v < 1) and bool(v.bind(3) >= 1)
    assert bool(v * 2 + 1 != 0)
    with pytest.raises(RuntimeError, match="no truth value"):
        bool(v.bind(3) > 3)  # decided by the value bound now only: a replay with another value would differ
    with pytest.raises(RuntimeError, match="no truth value"):
        bool(v)
