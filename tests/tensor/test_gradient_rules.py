"""Gradient rules of speck.tensor.gradient checked against float64 central finite differences, on tensor-level UOp
graphs evaluated by a small numpy reference evaluator (independent of the Tensor class and the scheduler)."""

import numpy as np
import pytest

from speck.tensor.gradient import compute_gradient, const_like
from speck.uop import Ops, UOp, dtypes


def ev(u, env):
    memo = {}
    for n in u.toposort():
        s = [memo.get(x) for x in n.src]
        if n.op is Ops.BUFFER:
            memo[n] = env[n]
        elif n.op is Ops.UNIQUE:
            memo[n] = None
        elif n.op is Ops.CONST:
            memo[n] = np.array(n.arg, dtype=np.float64)
        elif n.op is Ops.RESHAPE:
            memo[n] = s[0].reshape(n.arg)
        elif n.op is Ops.EXPAND:
            memo[n] = np.broadcast_to(s[0], n.arg)
        elif n.op is Ops.PERMUTE:
            memo[n] = s[0].transpose(n.arg)
        elif n.op is Ops.PAD:
            memo[n] = np.pad(s[0], n.arg)
        elif n.op is Ops.SHRINK:
            memo[n] = s[0][tuple(slice(a, b) for a, b in n.arg)]
        elif n.op is Ops.FLIP:
            memo[n] = np.flip(s[0], [i for i, f in enumerate(n.arg) if f])
        elif n.op is Ops.REDUCE_AXIS:
            memo[n] = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[n.arg[0]](s[0], axis=n.arg[1], keepdims=True)
        elif n.op is Ops.ADD:
            memo[n] = s[0] + s[1]
        elif n.op is Ops.MUL:
            memo[n] = s[0] * s[1]
        elif n.op is Ops.FDIV:
            memo[n] = s[0] / s[1]
        elif n.op is Ops.MAX:
            memo[n] = np.maximum(s[0], s[1])
        elif n.op is Ops.EXP2:
            memo[n] = np.exp2(s[0])
        elif n.op is Ops.LOG2:
            memo[n] = np.log2(s[0])
        elif n.op is Ops.SIN:
            memo[n] = np.sin(s[0])
        elif n.op is Ops.SQRT:
            memo[n] = np.sqrt(s[0])
        elif n.op is Ops.RECIPROCAL:
            memo[n] = 1 / s[0]
        elif n.op is Ops.CMPNE:
            memo[n] = s[0] != s[1]
        elif n.op is Ops.CMPLT:
            memo[n] = s[0] < s[1]
        elif n.op is Ops.CMPEQ:
            memo[n] = s[0] == s[1]
        elif n.op is Ops.CAST:
            memo[n] = s[0].astype(np.float64)
        elif n.op is Ops.DETACH:
            memo[n] = s[0]
        elif n.op is Ops.WHERE:
            memo[n] = np.where(s[0], s[1], s[2])
        elif n.op is Ops.POW:
            memo[n] = s[0] ** s[1]
        else:
            raise NotImplementedError(n.op)
    return memo[u]


EXPRS = {
    "mul_exp2": lambda a, b: (a * b.expand((3, 4))).exp2(),
    "div_sqrt_log2": lambda a, b: (a / b.expand((3, 4))).sqrt().log2(),
    "max_sin_reducemax": lambda a, b: a.maximum(b.expand((3, 4))).sin().reduce_axis(Ops.MAX, (1,)),
    "movement_pow": lambda a, b: (
        a.permute((1, 0))
        .pad(((1, 0), (0, 2)))
        .shrink(((0, 3), (1, 4)))
        .flip((True, False))
        .pow(b.reshape((4, 1)).shrink(((0, 3), (0, 1))).expand((3, 3)))
    ),
    "prod": lambda a, b: a.reduce_axis(Ops.MUL, (1,)),
    "where_recip": lambda a, b: (a < b.expand((3, 4))).where(a.reciprocal(), a * a),
    "cast_sub": lambda a, b: (a - b.expand((3, 4))).cast(dtypes.float64) * a,
}


@pytest.mark.parametrize("name", sorted(EXPRS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_matches_finite_differences(name, seed):
    rng = np.random.default_rng(seed)
    a = UOp(Ops.BUFFER, dtypes.float64, (UOp(Ops.UNIQUE, arg=0),), 12).reshape((3, 4))
    b = UOp(Ops.BUFFER, dtypes.float64, (UOp(Ops.UNIQUE, arg=1),), 4).reshape((1, 4))
    A, B = rng.uniform(0.5, 2, (3, 4)), rng.uniform(0.5, 2, (1, 4))
    env = {a.src[0]: A.reshape(12), b.src[0]: B.reshape(4)}
    body = EXPRS[name](a, b)
    out = body.reduce_axis(Ops.ADD, tuple(range(len(body.shape))))
    grads = compute_gradient(out, const_like(out, 1.0), [a, b])
    assert a in grads
    for t, T, key in ((a, A, a.src[0]), (b, B, b.src[0])):
        if t not in grads:
            continue
        num, eps = np.zeros_like(T), 1e-6
        for idx in np.ndindex(T.shape):
            tp, tm = T.copy(), T.copy()
            tp[idx] += eps
            tm[idx] -= eps
            num[idx] = (ev(out, {**env, key: tp.reshape(-1)}).sum() - ev(out, {**env, key: tm.reshape(-1)}).sum()) / (
                2 * eps
            )
        np.testing.assert_allclose(ev(grads[t], env), num, rtol=1e-4, atol=1e-6)


def test_detach_stops_gradient():
    a = UOp(Ops.BUFFER, dtypes.float64, (UOp(Ops.UNIQUE, arg=0),), 4)
    out = (UOp(Ops.DETACH, a.dtype, (a,)) * a).reduce_axis(Ops.ADD, (0,))
    g = compute_gradient(out, const_like(out, 1.0), [a])
    A = np.arange(1.0, 5.0)
    np.testing.assert_allclose(ev(g[a], {a: A}), A)  # only the non-detached factor contributes


def test_unreachable_target_is_absent():
    a = UOp(Ops.BUFFER, dtypes.float64, (UOp(Ops.UNIQUE, arg=0),), 4)
    c = UOp(Ops.BUFFER, dtypes.float64, (UOp(Ops.UNIQUE, arg=1),), 4)
    out = (a * a).reduce_axis(Ops.ADD, (0,))
    assert c not in compute_gradient(out, const_like(out, 1.0), [a, c])
