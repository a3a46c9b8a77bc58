"""float64 asin and erf to a few float64 ulps, and float64 sin's argument reduction for any finite x.
elementwise.py's forms of asin and erf are float32-grade approximations (a polynomial fit with an absolute error of
2e-8, a rational fit of 1.5e-7), which is what tinygrad computes too; a float64 tensor gets series that converge to
its own precision instead, so `Tensor(x, dtype=float64).asin()` (and
acos, atan, which are built on it) agrees with numpy/math to ~1e-16 rather than to 1e-8.

Every function takes and returns a float64 Tensor. Branches are selected with `where`, and each branch is fed only
the inputs it is selected for (a harmless filler elsewhere), so an unselected branch's infinite derivative never
turns a gradient into 0 * inf = NaN."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from speck.uop import dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

# asin(z) = z + z * sum(c_n z^(2n)), c_n = (2n)! / (4^n (n!)^2 (2n + 1)); for z <= 1/2 the 26th term is below 1e-18
_ASIN_TERMS = [math.comb(2 * n, n) / (4**n * (2 * n + 1)) for n in range(1, 27)]
# erf(x) = 2/sqrt(pi) e^(-x^2) sum(2^n x^(2n+1) / (2n+1)!!): all terms positive (no cancellation); 60 terms reach
# 1e-17 of the sum up to x = 2.5
_ERF_SERIES_TERMS = 60
_ERF_SPLIT = 2.5
# erfc(x) = e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))): from x = 2.5 on, 80 levels of the continued
# fraction give erfc to ~1e-15 of itself, below a float64 ulp of erf = 1 - erfc
_ERFC_CF_DEPTH = 80
# erfc(6) = 2.2e-17 < half an ulp of 1: erf is exactly +-1 beyond
_ERF_ONE = 6.0


def odd_abs(x: Tensor) -> Tensor:
    """|x| for building an odd function as sign(x) * f(|x|): its derivative is 1 at 0 where abs's is sign(0) = 0,
    which gave tanh, asin, atan, asinh and erf a zero gradient at exactly 0."""
    neg: Tensor = x < 0
    return neg.where(-x, x)


def _asin_series(z: Tensor) -> Tensor:
    """asin(z) for 0 <= z <= 1/2 by its Taylor series (Horner in z^2)."""
    t = z * z
    acc = t * _ASIN_TERMS[-1]
    for c in reversed(_ASIN_TERMS[:-1]):
        acc = (acc + c) * t
    out: Tensor = z + z * acc
    return out


def asin64(x: Tensor) -> Tensor:
    """asin of a float64 tensor: the series on |x| <= 1/2, and asin(a) = pi/2 - 2 asin(sqrt((1 - a)/2)) above (1 - a
    is exact there, and the reduced argument is again <= 1/2); outside [-1, 1] NaN, as sqrt of a negative gives."""
    a = odd_abs(x)
    hi = a > 0.5
    lo_in = hi.where(0.0, a)
    hi_in = hi.where(a, 0.75)  # (0.75: any point where sqrt's derivative is finite)
    r = hi.where((math.pi / 2) - 2 * _asin_series(((1 - hi_in) * 0.5).sqrt()), _asin_series(lo_in))
    return (x < 0).where(-r, r)


def erf64(x: Tensor) -> Tensor:
    """erf of a float64 tensor: the positive series below 2.5, 1 - erfc by its continued fraction from there to 6,
    exactly 1 beyond; odd symmetry restores the sign (NaN stays NaN)."""
    a = odd_abs(x)
    near = a < _ERF_SPLIT
    s = near.where(a, 1.0)
    t = s * s
    term = s
    total = s
    for n in range(1, _ERF_SERIES_TERMS):
        term = term * (2 * t / (2 * n + 1))
        total = total + term
    small = total * (-t).exp() * (2 / math.sqrt(math.pi))
    b = near.where(_ERF_SPLIT, a.minimum(_ERF_ONE))
    frac = b
    for k in range(_ERFC_CF_DEPTH, 0, -1):
        frac = b + (k * 0.5) / frac
    big = 1 - (-(b * b)).exp() / (frac * math.sqrt(math.pi))
    r = near.where(small, (a >= _ERF_ONE).where(1.0, big))
    return (x < 0).where(-r, r)


def _two_over_pi_pieces(bits: int, width: int) -> list[float]:
    """2/pi's binary expansion in `width`-bit pieces (each an exact float64) down to bit `bits`, from integer
    arithmetic: pi by Machin's formula with 64 guard bits."""
    prec = bits + 64
    one = 1 << prec

    def atan_inv(n: int) -> int:  # atan(1/n) * 2^prec
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k, sign = k + 2, -sign
        return total

    pi = 16 * atan_inv(5) - 4 * atan_inv(239)
    frac = (2 << (prec + bits)) // pi  # floor(2/pi * 2^bits)
    return [math.ldexp((frac >> (bits - width * (k + 1))) & ((1 << width) - 1), -width * (k + 1))
            for k in range(bits // width)]  # fmt: skip


# 2/pi in 26-bit pieces to bit 1170: a float64 below 2^1024 times each piece reduced mod 4 leaves the quarter turns
# with 53 + ~90 bits to spare
_TWO_OVER_PI_26 = _two_over_pi_pieces(1170, 26)
_HIGH_26 = (1 << 64) - (1 << 27)  # a float64 keeping its sign, exponent and top 26 significand bits


def quarter_turns64(x: Tensor) -> Tensor:
    """x * 2/pi reduced to [-2, 2] (quarter turns) for any finite float64 x: Payne-Hanek reduction. x splits into a
    26-bit and a 27-bit half (its significand's low 27 bits cleared, and the rest), each product with a 26-bit
    piece of 2/pi is exact in float64 and is reduced mod 4 exactly, and the running sum is kept in [-2, 2]."""
    hi = (x.bitcast(dtypes.uint64) & _HIGH_26).bitcast(dtypes.float64)
    lo = x - hi
    total = x * 0
    for c in _TWO_OVER_PI_26:
        for half in (hi, lo):
            t = half * c
            total = total + (t - 4 * (t * 0.25).trunc())
            total = total - 4 * (total * 0.25).round()
    return total
