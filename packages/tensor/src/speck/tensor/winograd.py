"""Winograd's minimal-filtering convolution F(m, r) as a rewrite of a stride-1 convolution into Tensor ops.

A 1-d correlation of m outputs with an r-tap filter over a tile of a = m + r - 1 inputs is
    y = At @ ((G @ g) * (Bt @ d))
with a products instead of m * r. In n dims the transforms apply along every axis (their Kronecker product), so a 2-d
tile costs a**2 products for m**2 outputs: F(2, 3) 16 for 36 direct multiply-adds, F(4, 5) 64 for 400. Over the
channels the products become a batched matrix multiply, one per tile position (a**n of them).

The matrices come from Toom-Cook: evaluate both polynomials at a - 1 points and infinity, multiply pointwise,
interpolate. They are built here exactly (Fractions) from the points 0, 1, -1, 2, -2, 1/2, -1/2, ... (the usual
choice: small, so the transforms stay well conditioned); `matrices` checks them against the direct correlation."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from speck.tensor.dims import as_int
from speck.tensor.errors import TensorValueError
from speck.tensor.schedule import scratch_nodes
from speck.uop import dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

Mat = tuple[tuple[Fraction, ...], ...]


def _points(count: int) -> list[Fraction]:
    pts = [Fraction(0)]
    k = 1
    while len(pts) < count:
        for p in (Fraction(k), Fraction(-k), Fraction(1, k + 1), Fraction(-1, k + 1)):
            if p not in pts:
                pts.append(p)
        k += 1
    return pts[:count]


def _inverse(m: list[list[Fraction]]) -> list[list[Fraction]]:
    """Exact Gauss-Jordan inverse of a square matrix (the Vandermonde matrices here are always invertible)."""
    n = len(m)
    a = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(m)]
    for c in range(n):
        p = next(r for r in range(c, n) if a[r][c] != 0)
        a[c], a[p] = a[p], a[c]
        inv = 1 / a[c][c]
        a[c] = [v * inv for v in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c])]
    return [row[n:] for row in a]


@functools.cache
def matrices(m: int, r: int) -> tuple[Mat, Mat, Mat]:
    """(At (m x a), G (a x r), Bt (a x a)) of F(m, r), a = m + r - 1, with y = At @ ((G @ g) * (Bt @ d)) the
    correlation y[i] = sum_k g[k] * d[i + k]. Each row of Bt is scaled to coprime integers (its factor moves into G),
    so the input transform, which runs on every tile, adds and subtracts small integer multiples."""
    if m < 1 or r < 1:
        raise TensorValueError(f"Winograd F(m, r) needs m >= 1 outputs and r >= 1 taps, got F({m}, {r})")
    a = m + r - 1
    pts = _points(a - 1)
    # evaluation at the points and at infinity (the leading coefficient)
    ev_h = [[p**i for i in range(m)] for p in pts] + [[Fraction(int(i == m - 1)) for i in range(m)]]
    ev_g = [[p**k for k in range(r)] for p in pts] + [[Fraction(int(k == r - 1)) for k in range(r)]]
    vand = [[p**j for j in range(a)] for p in pts] + [[Fraction(int(j == a - 1)) for j in range(a)]]
    bt = [list(col) for col in zip(*_inverse(vand))]  # the interpolation's transpose
    g = [row[:] for row in ev_g]
    for j, row in enumerate(bt):
        den = functools.reduce(lambda x, y: x * y // _gcd(x, y), (v.denominator for v in row), 1)
        num = functools.reduce(_gcd, (abs(v.numerator) * den // v.denominator for v in row if v), 0) or 1
        s = Fraction(den, num)
        bt[j] = [v * s for v in row]
        g[j] = [v / s for v in g[j]]
    at = [list(col) for col in zip(*ev_h)]
    res = tuple(map(tuple, at)), tuple(map(tuple, g)), tuple(map(tuple, bt))
    _check(m, r, *res)
    return res


def _gcd(x: int, y: int) -> int:
    while y:
        x, y = y, x % y
    return x


def _check(m: int, r: int, at: Mat, g: Mat, bt: Mat) -> None:
    """The algorithm must be the correlation exactly: every output's coefficient of every filter tap times input."""
    a = m + r - 1
    for i, k, d in itertools.product(range(m), range(r), range(a)):
        coef = sum(at[i][j] * g[j][k] * bt[j][d] for j in range(a))
        assert coef == int(d == i + k), f"F({m}, {r}): output {i} tap {k} input {d} has coefficient {coef}"


def _transform(mat: Mat, t: Tensor, dims: int) -> Tensor:
    """`mat` (p x q) applied along each of t's leading `dims` axes, one axis at a time (the Kronecker product is
    separable: q MACs per output and axis rather than q**dims), each pass a small matmul-shaped reduction that codegen
    register-blocks: (q, ..., q, *rest) -> (p, ..., p, *rest)."""
    p, q = len(mat), len(mat[0])
    rest = t.shape[dims:]
    k = type(t)([[float(v) for v in row] for row in mat], dtype=t.dtype, device=t.device)
    at = dims - 1  # where pass d's axis q_d goes: after the q axes still to do and the p axes done
    kk = k.reshape(*([1] * at), p, q, *([1] * len(rest)))
    for _ in range(dims):
        # t is (q_d, ..., q_{dims-1}, p_0, ..., p_{d-1}, *rest): q_d goes to just before rest, reduced against mat
        tt = t.permute(*range(1, 1 + at), 0, *range(1 + at, t.ndim))
        tt = tt.reshape(*tt.shape[:at], 1, *tt.shape[at:])
        t = (kk * tt).sum(at + 1)
    return t


KERNELS = (3, 5)  # kernel sizes rewritten (their matrices are checked, their accuracy measured: module docstring)
TILES = (2, 4)  # outputs per tile and axis: F(2, r) or F(4, r)
MIN_CHANNELS = 16  # WINO=1: fewer input or output channels leave the transforms more work than they save


def winograd_tile(x: Tensor, weight: Tensor, stride: tuple[int, ...], dilation: tuple[int, ...],
                  pads: Sequence[tuple[int, int]], mode: int) -> int:  # fmt: skip
    """m of the F(m, r) a convolution runs as under WINO=`mode`, or 0 for the direct convolution. Eligible: 2-d,
    stride 1, undilated, one group (the caller checks), a square 3x3 or 5x5 kernel, static shapes, float operands
    of one dtype (WINO=1: float32 with at least MIN_CHANNELS input and output channels). m minimizes the products
    of the batched matmul, a**2 per tile (ties go to the smaller tile, the more accurate)."""
    if mode not in (0, 1, 2):
        raise TensorValueError(f"WINO must be 0 (direct convolutions), 1 (Winograd where it pays off) or 2 (Winograd "
                               f"for every eligible convolution), got {mode!r}; set one of those")  # fmt: skip
    if mode == 0 or weight.ndim != 4 or x.ndim != 4 or any(s != 1 for s in (*stride, *dilation)):
        return 0
    shape = (*x.shape, *weight.shape)
    if not all(isinstance(d, int) for d in shape) or weight.shape[2] != weight.shape[3]:
        return 0
    r = as_int(weight.shape[2])
    if r not in KERNELS or x.dtype != weight.dtype or not dtypes.is_float(x.dtype):
        return 0
    if mode == 1 and (x.dtype != dtypes.float32 or min(as_int(x.shape[1]), as_int(weight.shape[0])) < MIN_CHANNELS):
        return 0
    osp = [as_int(s) + pb + pa - r + 1 for s, (pb, pa) in zip(x.shape[2:], pads)]
    if min(osp) < 2:
        return 0
    cost = {m: math.prod((m + r - 1) * -(-o // m) for o in osp) for m in TILES}
    return min(TILES, key=lambda m: (cost[m], m))


def conv(x: Tensor, weight: Tensor, m: int) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """The stride-1, undilated, single-group correlation of x (N, C, *S) (padding already applied) with weight
    (Co, C, *r) (r the same along every dim) through F(m, r): (N, Co, *(S - r + 1)), and the function that maps its
    gradient to the weight's through the same transforms (see weight_gradient)."""
    nsp = weight.ndim - 2
    r = as_int(weight.shape[2])
    a = m + r - 1
    at, g, bt = matrices(m, r)
    n, c = x.shape[:2]
    co = weight.shape[0]
    osp = [as_int(s) - r + 1 for s in x.shape[2:]]
    tn = [-(-o // m) for o in osp]
    extra = [t * m + r - 1 - as_int(s) for t, s in zip(tn, x.shape[2:])]
    sp = tuple(range(2, 2 + nsp))
    # channel-last, so the input transform reads (and writes) vectors of channels
    x = _scratch(x.permute(0, *sp, 1)).permute(0, 1 + nsp, *range(1, 1 + nsp))
    if any(extra):
        x = x.pad(((0, 0), (0, 0), *((0, e) for e in extra)))
    tiles = x._windows((a,) * nsp, (m,) * nsp, (1,) * nsp)  # (N, C, *T, *a)
    tiles = tiles.permute(*range(2 + nsp, 2 + 2 * nsp), 0, *sp, 1)  # (*a, N, *T, C)
    # a buffer of its own: the weight gradient reads it again (or it would be recomputed for it, in another layout);
    # remembered (not scratch): a backward scheduled after the forward was realized reads it instead of redoing it
    v = _transform(bt, tiles, nsp).contiguous().reshape(a**nsp, n, *tn, c)  # (P, N, *T, C)
    u = _transform(g, weight.permute(*sp, 1, 0), nsp).reshape(a**nsp, c, co)  # (P, C, Co)
    pp = a**nsp
    prod_ = v.reshape(pp, n, *tn, c, 1) * u.reshape(pp, *([1] * (1 + nsp)), c, co)
    mm = prod_.sum(axis=2 + nsp)  # (P, N, *T, Co)
    y = _scratch(_transform(at, mm.reshape(*([a] * nsp), n, *tn, co), nsp))  # (*m, N, *T, Co)
    # -> (N, Co, T0, m0, T1, m1, ...) -> (N, Co, *(T * m)), cropped to the output size
    order = [nsp, 2 * nsp + 1] + [i for d in range(nsp) for i in (nsp + 1 + d, d)]
    y = y.permute(*order).reshape(n, co, *(t * m for t in tn))
    if any(t * m != o for t, o in zip(tn, osp)):
        y = y.shrink(((0, n), (0, co), *((0, o) for o in osp)))
    # copied out in (N, Co, *S) order: the layers after a convolution (BatchNorm's statistics, ReLU, pooling) read
    # its output several times, each read of the tile-major layout a strided gather (BatchNorm's sums over conv2's
    # output: 1.0 -> 5.0 ms each), while the copy is one pass
    return y.contiguous(), functools.partial(weight_gradient, v, m, r, tn)


def weight_gradient(v: Tensor, m: int, r: int, tn: Sequence[int], grad: Tensor) -> Tensor:
    """The weight gradient of conv's output given its gradient (N, Co, *O), from the forward's transformed input v
    (P, N, *T, C): each tile's output gradient transformed by At's transpose, multiplied with v and summed over the
    images and tiles (a matmul per tile position, as in the forward), then back to taps by G's transpose. A 5x5
    weight gradient costs P = 64 products per 16 outputs of a tile where the direct sum costs 400."""
    nsp = len(tn)
    at, g, _ = matrices(m, r)
    n, co = grad.shape[:2]
    c = v.shape[-1]
    osp = [as_int(d) for d in grad.shape[2:]]
    if any(t * m != o for t, o in zip(tn, osp)):
        grad = grad.pad(((0, 0), (0, 0), *((0, t * m - o) for t, o in zip(tn, osp))))
    # channel-last, so the transform reads vectors of channels: (N, T0, m, T1, m, ..., Co) -> (*m, N, *T, Co)
    grad = _scratch(grad.permute(0, *range(2, 2 + nsp), 1))
    tiles = grad.reshape(n, *(d for t in tn for d in (t, m)), co)
    tiles = tiles.permute(*(2 + 2 * d for d in range(nsp)), 0, *(1 + 2 * d for d in range(nsp)), 1 + 2 * nsp)
    a = m + r - 1
    pp, nt = a**nsp, math.prod((n, *tn))
    dm = _transform(_transpose(at), tiles, nsp).reshape(pp, nt, co)  # (P, N * T, Co)
    du = (v.reshape(pp, nt, c, 1) * dm.reshape(pp, nt, 1, co)).sum(1)  # (P, C, Co)
    dw = _transform(_transpose(g), du.reshape(*([a] * nsp), c, co), nsp)  # (*r, C, Co)
    return dw.permute(1 + nsp, nsp, *range(nsp))


def _scratch(t: Tensor) -> Tensor:
    """t.contiguous() as an intermediate of this rewrite only: its buffer is not remembered for later graphs, so it
    can share memory with others (speck.tensor.schedule.scratch_nodes)."""
    out = t.contiguous()
    if out.uop is not t.uop:  # (a node this call made, not one t already was)
        scratch_nodes.add(out.uop)
    return out


def _transpose(mat: Mat) -> Mat:
    return tuple(zip(*mat))
