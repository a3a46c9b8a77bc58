# mypy: disable-error-code="misc"
# (methods annotate `self: Tensor` so bodies type-check against the full class; mypy flags such self-types on a
# mixin that Tensor subclasses as "misc" - that is the only error silenced here)
"""Random numbers: a counter-based generator (threefry2x32 of a per-device [seed, counter] buffer) and the
distributions and initialisers built on it (rand, randn, randint, normal, uniform, the glorot/kaiming
initialisers, randperm, multinomial, manual_seed). The methods are added to Tensor as a mixin like the other op
modules'; the constructors are classmethods building results with `cls` (methods with `type(self)`), never by
importing tensor.py."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from speck.tensor import elementwise as ew
from speck.tensor import realize
from speck.tensor.device import canonical
from speck.tensor.dims import argfix, as_int, countable, flag, init_shape, real, shape_arg, whole
from speck.tensor.errors import TensorAssertionError, TensorOverflowError, TensorTypeError, TensorValueError
from speck.tensor.movement import expand, shrink
from speck.tensor.multi import MultiUOp
from speck.tensor.nodes import _dt, _from_numpy, _iota_uop
from speck.tensor.realize import realize_graph
from speck.tensor.schedule import base_buffer, view_offset
from speck.tensor.settings import SEED
from speck.uop import DType, Ops, UOp, dtypes
from speck.uop.helpers import prod

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

DTypeLike = DType | str

# (a seed past 64 bits keeps its low 64, as manual_seed does: the counter buffer is uint64)
_RNG: dict[str, int] = {
    "seed": int(SEED.value) & 0xFFFFFFFFFFFFFFFF if int(SEED.value) >= 0 else int(time.time()) & 0xFFFFFFFF
}
# device -> its random-counter BUFFER, uint64 [seed, counter]: every draw reads it as a kernel input and advances it
# in place, so TinyJit replays draw fresh numbers (a Python-side counter would be a constant of the captured kernels)
_RNG_STATE: dict[str, UOp] = {}
# (device, n) -> the graph computing [seed, counter + n] from the counter buffer (its increment buffer is never
# written, so every draw of n numbers reuses it instead of building the graph and copying an increment in again)
_RNG_STEP: dict[tuple[str, int], UOp] = {}


def forget(device: str) -> None:
    """Drop device's counter buffer and step graphs (Device.reopen lost them with the device's memory): its next
    draw starts a new counter from the current seed, as on a device that never drew."""
    _RNG_STATE.pop(device, None)
    for k in [k for k in _RNG_STEP if k[0] == device]:
        del _RNG_STEP[k]


class RandomMixin:
    """Tensor's random-number methods (mixed into Tensor)."""

    __slots__ = ()

    def rand_like(self: Tensor, **kw: Any) -> Tensor:
        """rand of self's shape; dtype defaults to self's, which must then be a float. A sharded tensor gets
        independent draws on every device, sharded like it."""
        if isinstance(self.uop, MultiUOp):
            dt = kw.pop("dtype", self.dtype)
            return self._like_shards(lambda s, d, i: type(self)(s, device=d).rand_like(dtype=dt, _stream=i, **kw), kw)
        return type(self).rand(
            *self.shape, dtype=kw.pop("dtype", self.dtype), device=kw.pop("device", self.device), **kw
        )

    def randn_like(self: Tensor, dtype: DTypeLike | None = None, **kw: Any) -> Tensor:
        """randn of self's shape, cast to dtype (default self's; int dtypes get the cast normals)."""
        dt = _dt(dtype) or self.dtype
        if isinstance(self.uop, MultiUOp):
            return self._like_shards(lambda s, d, i: type(self)(s, device=d).randn_like(dtype=dt, _stream=i, **kw), kw)
        out = type(self).randn(*self.shape, dtype=dt if dtypes.is_float(dt) else None,
                               device=kw.pop("device", self.device), **kw)  # fmt: skip
        return out.cast(dt)

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        """Seed the counter-based generator: the same seed gives the same numbers on every device. Every device's
        counter buffer is rewritten in place (same buffer, new contents), so TinyJit captures made before keep
        drawing from it; a manual_seed inside a jitted function is replayed as that rewrite on every call."""
        _RNG["seed"] = whole("manual_seed", "seed", seed) & 0xFFFFFFFFFFFFFFFF  # (int("a") was a bare ValueError)
        for dev, state in _RNG_STATE.items():
            _rng_store(state, _rng_initial(dev))

    @classmethod
    def rand(
        cls: type[Tensor], *shape: Any, device: str | None = None, dtype: DTypeLike | None = None, **kw: Any
    ) -> Tensor:
        """Uniform [0, 1) values."""
        if isinstance(device, (tuple, list)):
            raise TensorValueError(
                f"rand can't make a tensor over several devices {tuple(device)}; make one on a single "
                "device and .shard() it, or use rand_like on a sharded tensor (independent shards)"
            )
        if unknown := sorted(set(kw) - {"_stream", "contiguous", "requires_grad"}):
            raise TensorTypeError(f"rand() got unexpected keyword arguments {unknown}; it takes shape, device=, dtype= "
                                  "and contiguous=")  # fmt: skip
        sh = shape_arg("rand", argfix(*shape))
        dt = _dt(dtype) or dtypes.default_float
        if not dtypes.is_float(dt):
            raise TensorValueError(f"rand needs a float dtype, got {dt}; use randint for integers")
        if not all(isinstance(s, int) and s >= 0 for s in sh):
            raise TensorValueError(f"rand needs a concrete shape of non-negative sizes, got {sh}")
        countable(sh)  # (2**80 numbers overflowed a C long in the draw)
        if isinstance(device, (tuple, list)):
            raise TensorValueError("rand can't draw for a tuple of devices; use rand_like on a sharded tensor")
        n = int(prod(sh))
        if n == 0:
            return cls.zeros(sh, dtype=dt, device=device)
        dev = canonical(device)
        bits = cls(random_bits(n, dev, int(kw.get("_stream", 0))), device=dev)
        # the top m bits -> k / 2**m in [0, 1), m = the dtype's significand width, so every value is exact in dt:
        # rounding 24 bits to half/bf16/fp8 would give 1.0 for draws just below it, and float64 gets its 53 bits
        # (as tinygrad fills the whole mantissa), not float32's 24 (2**24 values: duplicates in any large draw)
        m = dtypes.finfo(dt)[1] + 1
        wide = dtypes.float64 if m > 24 else dtypes.float32
        u = (bits >> (64 - m)).cast(wide) * (2.0**-m)
        return u.cast(dt).reshape(sh)

    @classmethod
    def randn(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, **kw: Any) -> Tensor:
        """Standard normal values (Box-Muller)."""
        sh = shape_arg("randn", argfix(*shape))
        dt = _dt(dtype) or dtypes.default_float
        u = cls.rand(2, *sh, **kw)
        r = ((1 - u[0]).log() * -2).sqrt()
        return (r * (u[1] * (2 * math.pi)).cos()).cast(dt)

    @classmethod
    def randint(
        cls: type[Tensor], *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32, **kw: Any
    ) -> Tensor:
        if not isinstance(low, int) or not isinstance(high, int):
            raise TensorTypeError(f"randint needs int bounds, got low={low!r}, high={high!r}")
        if high <= low:
            raise TensorValueError(f"randint needs low < high, got low={low}, high={high}")
        dt = _dt(dtype) or dtypes.int32
        if not dtypes.is_int(dt):
            raise TensorTypeError(f"randint needs an int dtype, got {dtype}")
        if low < dtypes.min(dt) or high - 1 > dtypes.max(dt):  # (the draws wrapped: high=2**40 gave negative int32s)
            raise TensorOverflowError(f"randint: [low, high) = [{low}, {high}) doesn't fit {dt} [{dtypes.min(dt)}, "
                                      f"{dtypes.max(dt)}]; pass a wider dtype (e.g. dtype=dtypes.int64)")  # fmt: skip
        return (cls.rand(*shape, dtype=dtypes.float64, **kw) * (high - low) + low).floor().cast(dt)

    @classmethod
    def normal(cls: type[Tensor], *shape: Any, mean: float = 0.0, std: float = 1.0, **kw: Any) -> Tensor:
        mean = real("normal", "mean", mean)
        if real("normal", "std", std) < 0:
            raise TensorValueError(f"normal needs std >= 0, got {std}")
        return cls.randn(*shape, **kw) * std + mean

    @classmethod
    def uniform(cls: type[Tensor], *shape: Any, low: float = 0.0, high: float = 1.0, **kw: Any) -> Tensor:
        if not real("uniform", "low", low) < real("uniform", "high", high):
            raise TensorValueError(f"uniform needs low < high, got low={low}, high={high}")
        dt = _dt(kw.pop("dtype", None)) or dtypes.default_float
        # drawn at the default float, or at dt when that holds more bits (a float64 uniform gets 53 random bits)
        wide = dtypes.is_float(dt) and dtypes.finfo(dt)[1] > dtypes.finfo(dtypes.default_float)[1]
        return (cls.rand(*shape, dtype=dt if wide else None, **kw) * (high - low) + low).cast(dt)

    @classmethod
    def scaled_uniform(cls: type[Tensor], *shape: Any, **kw: Any) -> Tensor:
        sh = init_shape("scaled_uniform", shape)
        scale: float = float(prod(sh)) ** -0.5 if prod(sh) else 1.0  # (empty: no value to scale; 0 ** -0.5 raised)
        return cls.uniform(*sh, low=-1.0, high=1.0, **kw) * scale

    @classmethod
    def glorot_uniform(cls: type[Tensor], *shape: Any, **kw: Any) -> Tensor:
        sh = init_shape("glorot_uniform", shape)
        if not sh:  # (sh[0]: a bare IndexError)
            raise TensorValueError("glorot_uniform needs a shape of at least 1 dim, got ()")
        bound = math.sqrt(6 / (sh[0] + prod(sh[1:]))) if sh[0] + prod(sh[1:]) else 1.0  # (empty: any bound)
        return cls.uniform(*sh, low=-bound, high=bound, **kw)

    @classmethod
    def kaiming_uniform(cls: type[Tensor], *shape: Any, a: float = 0.01, **kw: Any) -> Tensor:
        sh, a = init_shape("kaiming_uniform", shape), real("kaiming_uniform", "a", a)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a * a)) / math.sqrt(prod(sh[1:]) or 1)  # (no fan-in: empty)
        # (a slope so steep that the bound is 0: the range [-0, 0] holds only 0, which uniform refuses as low == high)
        return cls.uniform(*sh, low=-bound, high=bound, **kw) if bound > 0 else cls.zeros(*sh, **kw)

    @classmethod
    def kaiming_normal(cls: type[Tensor], *shape: Any, a: float = 0.01, **kw: Any) -> Tensor:
        sh, a = init_shape("kaiming_normal", shape), real("kaiming_normal", "a", a)
        # (a * a, not a**2: a float power past the range raised OverflowError; inf gives the limit, a gain of 0)
        std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(prod(sh[1:]) or 1)  # (no fan-in: the tensor is empty)
        return cls.normal(*sh, mean=0.0, std=std, **kw)

    @classmethod
    def randperm(
        cls: type[Tensor], n: int, device: str | None = None, dtype: DTypeLike = dtypes.int32, **kw: Any
    ) -> Tensor:
        n, dt = whole("randperm", "n", n), _dt(dtype) or dtypes.int32
        if n < 0:
            raise TensorValueError(f"randperm needs n >= 0, got {n}")
        if dtypes.is_int(dt) and n - 1 > dtypes.max(dt):  # (randperm(300, dtype=int8) wrapped to repeats)
            raise TensorOverflowError(f"randperm({n}) needs a dtype that holds {n - 1}, got {dt}; pass e.g. "
                                      "dtype=dtypes.int32")  # fmt: skip
        return cls.rand(n, device=device).argsort().cast(dt)

    def multinomial(self: Tensor, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Sample int32 indices from the (unnormalised) weights in the last dim (1-D or 2-D input); without
        replacement, num_samples distinct ones (by the exponential-race trick: top-k of u^(1/w)). The weights are
        not checked (that would be a device read per draw): a row with a negative or NaN weight, or all zeros,
        samples garbage indices where numpy raises; see the README's Errors section."""
        num_samples = whole("multinomial", "num_samples", num_samples)
        if not 1 <= self.ndim <= 2 or num_samples <= 0:
            raise TensorAssertionError(f"multinomial needs a 1-D or 2-D tensor and num_samples > 0, got {self.shape}")
        w = self.unsqueeze(0) if self.ndim == 1 else self
        if not flag("multinomial", "replacement", replacement) and num_samples > 1:
            if num_samples > as_int(w.shape[-1]):
                raise TensorAssertionError(f"can't draw {num_samples} samples without replacement from "
                                           f"{w.shape[-1]} categories")  # fmt: skip
            # key = log(u) / w: the largest keys are a weighted sample without replacement (zero weights: -inf)
            u = type(self).rand(*w.shape, device=self.device)
            key = (w.float() > 0).where(u.log() / w.float(), -math.inf)
            idx = key.topk(num_samples, dim=-1)[1].cast(dtypes.int32)
            return idx.squeeze(0) if self.ndim == 1 else idx
        cdf = (cw := w.float().cumsum(1)) / cw[:, -1:]
        u = type(self).rand(w.shape[0], num_samples, 1, device=self.device)
        idx = (u >= cdf.unsqueeze(1)).sum(2).cast(dtypes.int32)
        return idx.squeeze(0) if self.ndim == 1 else idx


def random_bits(n: int, device: str, stream: int = 0) -> UOp:
    """n uint64 random words on device: threefry2x32 of (counter, key), where the seed and counter come from the
    device's counter buffer. Each draw runs one small kernel that takes n fresh counters (so values never depend on
    when the draw is realized) and reads the advanced copy as an input of the draw's own kernel."""
    nxt = _rng_advance(n, device)  # realized [seed, counter after this draw]
    first = _with_scalar(ew.sub, shrink(nxt, ((1, 2),)), n, device)
    ctr = ew.add(ew.cast(_iota_uop(n, device), dtypes.uint64), expand(first, (n,)), device)
    # the draw's size is mixed into the key (as the split of tinygrad's counters into two halves does): rand(6)
    # is not rand(3) followed by rand(3); the shards of a sharded draw (stream) get independent streams too
    mix = (n * 0xD1B54A32D192ED03 ^ stream * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    key = _with_scalar(ew.bitwise_xor, expand(shrink(nxt, ((0, 1),)), (n,)), mix, device)
    return UOp(Ops.THREEFRY, dtypes.uint64, (ctr, key))


def _with_scalar(fn: Any, u: UOp, v: int, device: str) -> UOp:
    """fn(u, v) for a Python int v, promoted as Tensor's operators promote a literal (it takes u's dtype)."""
    a, b, dev, _ = ew.promote(u, device, v)
    out: UOp = fn(a, b, dev)
    return out


def _rng_initial(device: str) -> UOp:
    """A realized uint64 [seed, 0] on device (no kernel: copied in from the host)."""
    return _from_numpy(np.array([_RNG["seed"], 0], dtype=np.uint64), dtypes.uint64, device)


def _rng_state(device: str) -> UOp:
    """The device's counter buffer, made from the current seed on its first draw."""
    if (state := _RNG_STATE.get(device)) is None:
        state = _RNG_STATE[device] = _rng_initial(device)
    return state


def _rng_store(dst: UOp, src: UOp) -> None:
    """Copy src's contents into the counter buffer dst in place, recorded for TinyJit replays as the same copy.
    A copy, not Tensor.assign's storage swap: dst must never share storage with a buffer a lazy draw reads."""
    realize.run_entries([realize.copy_entry(dst, src)])


def _rng_advance(n: int, device: str) -> UOp:
    """Advance the device's counter by n: one kernel computes [seed, counter + n] into a new buffer (returned; draws
    read it, and nothing writes it again outside a TinyJit replay of this same step), which is then copied into the
    counter buffer. The increment comes in as a tiny buffer so one compiled kernel serves every draw size. This
    schedules directly instead of through realize(), which would also apply pending deferred updates early."""
    state = _rng_state(device)
    if (step := _RNG_STEP.get((device, n))) is None:
        if len(_RNG_STEP) >= 256:  # many distinct draw sizes: start over rather than grow without bound
            _RNG_STEP.clear()
        inc = _from_numpy(np.array([0, n], dtype=np.uint64), dtypes.uint64, device)
        step = _RNG_STEP[(device, n)] = state.alu(Ops.ADD, inc)
    view = realize_graph(step, device)
    nxt = base_buffer(view)
    assert nxt is not None and nxt is not state and view_offset(view) == 0
    _rng_store(state, nxt)
    return nxt
