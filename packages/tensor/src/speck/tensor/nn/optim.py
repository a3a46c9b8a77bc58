"""Optimizers: LARS (with SGD and Muon as its factory functions), LAMB (with Adam and AdamW), OptimizerGroup.

`schedule_step()` computes every new parameter and state value lazily from the *old* values (so every gradient sees
the parameters before the update), queues them as updates of their tensors and returns the tensors to realize;
realizing any tensor applies all queued updates in one schedule. `step()` does that realize. A step refuses to run
outside training mode (`Tensor.train()` or `Context(TRAINING=1)`): a step in evaluation mode is almost always a
bug. State (momentum buffers, the step count, the learning rate) lives in tensors, so a TinyJit-captured step
replays correctly and a learning rate assigned between replays takes effect."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from speck.tensor.dims import as_int
from speck.tensor.errors import OptimizerError as OptimizerError
from speck.tensor.errors import TensorTypeError, TensorValueError
from speck.tensor.multi import MultiUOp
from speck.tensor.schedule import base_buffer, view_offset
from speck.tensor.settings import CONST_LR as _CONST_LR
from speck.tensor.settings import FUSE_OPTIM
from speck.tensor.settings import OPTIM_DTYPE as _OPTIM_DTYPE
from speck.tensor.tensor import Tensor, is_training
from speck.tensor.writes import _DEFERRED, DEFERRED_ANY
from speck.uop import DType, Ops, dtypes, least_upper_dtype
from speck.uop.dtype import setting_dtype

# the dtype optimizer state (momentum, moments) is kept and computed in, at least (float64 params keep float64)
OPTIM_DTYPE: DType = setting_dtype(_OPTIM_DTYPE)
# 1: the learning rate is a constant of the graph instead of a tensor input (a schedule can't change it)
CONST_LR = int(_CONST_LR.value)


def _hyper(name: str, v: Any, below: float = math.inf) -> float:
    """An optimizer's number argument as a float in [0, below): NaN passed every `< 0` check and turned every weight
    NaN at the first step; infinity did the same; a beta of 1 or more diverges."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise TensorTypeError(f"{name} must be a number, got {type(v).__name__} {v!r:.40}") from None
    if not 0 <= x < below:
        bound = "finite" if below == math.inf else f"< {below:g}"
        raise TensorValueError(f"{name} must be >= 0 and {bound}, got {v!r}")
    return x


class Optimizer:
    """Base class. `params` are split into `.params` (is_param=True: updated from their `.grad`) and `.buffers`
    (is_param=False or requires_grad=False, e.g. BatchNorm statistics: realized with every step, not updated)."""

    def __init__(
        self, params: Sequence[Tensor], lr: float | Tensor, device: str | None = None, fused: bool | None = None
    ) -> None:
        lr_value = None if isinstance(lr, Tensor) else _hyper("learning rate", lr)
        if isinstance(lr, Tensor) and lr.numel() != 1:  # (it broadcast against each parameter, or failed to)
            raise TensorValueError(f"a learning rate tensor holds one value, got shape {lr.shape}; pass a 0-d or "
                                   "(1,) tensor")  # fmt: skip
        if isinstance(params, (Tensor, str)) or not isinstance(params, Iterable):  # ("'NoneType' is not iterable")
            raise TensorTypeError(f"an optimizer takes a list of Tensors, got {type(params).__name__} {params!r:.40}; "
                                  "pass get_parameters(model)")  # fmt: skip
        plist = list(params)
        if bad := [p for p in plist if not isinstance(p, Tensor)]:  # (before hashing them: "unhashable type: 'list'")
            raise TensorTypeError(f"an optimizer takes a list of Tensors, got {type(bad[0]).__name__} {bad[0]!r}; pass "
                                  "get_parameters(model)")  # fmt: skip
        unique = list(dict.fromkeys(plist))  # identity: Tensor hashes by id
        self.params = [p for p in unique if p.is_param and p.requires_grad is not False]
        self.buffers = [p for p in unique if not (p.is_param and p.requires_grad is not False)]
        if not self.params:
            raise OptimizerError(
                "optimizer got no parameters to update; pass the model's parameters (get_parameters(model)); tensors "
                "marked is_param=False or requires_grad=False are buffers it only realizes"
            )
        self.device = device if device is not None else self.params[0].device
        self.fused = bool(FUSE_OPTIM) if fused is None else bool(fused)
        if self.fused and len(devices := {p.device for p in self.params}) > 1:
            if fused:  # asked for here; FUSE_OPTIM (a process-wide default) leaves a model split across devices unfused
                raise OptimizerError(f"fused=True flattens every parameter into one buffer, but they live on "
                                     f"{len(devices)} devices ({', '.join(sorted(map(str, devices)))}); pass "
                                     "fused=False or use one optimizer per device")  # fmt: skip
            self.fused = False
        # parameters must live in buffers of their own: an update then writes them in place, and a TinyJit capture
        # of the step sees the same kernels on every call (a lazy initialiser would be folded into the first one)
        for p in self.params:
            if not _owns_buffer(p):
                p.uop = p.contiguous().realize().uop
        # at least float32, wider when a parameter is (a float64 model's lr 0.1 is not rounded to float32's)
        lr_dt = least_upper_dtype(dtypes.float32, *{p.dtype for p in self.params})
        lr_dt = lr_dt if dtypes.is_float(lr_dt) and not lr_dt.is_weak else dtypes.float32
        if isinstance(lr, Tensor):
            self.lr = lr
        elif CONST_LR:
            self.lr = Tensor(lr_value, dtype=lr_dt, device=self.device)
        else:
            self.lr = Tensor([lr_value], dtype=lr_dt, device=self.device).contiguous().realize()
        self.lr.is_param_(False).requires_grad = False

    def zero_grad(self) -> None:
        """Forget the gradients of every parameter (.grad = None)."""
        for p in self.params:
            p.grad = None

    def step(self, *realize_with: Tensor) -> None:
        """Apply one update: realize everything schedule_step() returns. `realize_with` tensors (e.g. the loss) are
        computed in the same schedule, from the parameters before the update."""
        Tensor.realize_all(*realize_with, *self.schedule_step())

    def schedule_step(self) -> list[Tensor]:
        """Queue the update of every parameter and state tensor (computed from the current values, applied at the
        next realize) and return the tensors that must be realized: optimizer state, params, buffers."""
        if not is_training():
            raise OptimizerError(
                "optimizer step outside training mode: wrap the training step in `with Tensor.train():` "
                "(or Context(TRAINING=1)); evaluation must not update parameters"
            )
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise OptimizerError(
                f"parameters {missing} of {len(self.params)} have no gradient; call loss.backward() before step(), "
                "and check that every parameter is in the loss's graph"
            )
        settle_deferred(*self.params, *self._state())
        updates = self._updates()
        for target, new in updates:
            _assign_later(target, new)
        return [*self._state(), *self.params, *self.buffers]

    # -- what optimizers define --
    def _updates(self) -> list[tuple[Tensor, Tensor]]:
        """(tensor, its new value) for every tensor one step writes."""
        raise NotImplementedError

    def _state(self) -> list[Tensor]:
        """The optimizer's state tensors."""
        return []

    # -- shared pieces --
    def _lr(self, dtype: DType, w: Tensor) -> Tensor:
        """The learning rate as a 0-d tensor of dtype (it broadcasts to any parameter shape, 0-d included) on the
        device of slot value w."""
        return _beside(self.lr.reshape(()).cast(dtype) if self.lr.shape else self.lr.cast(dtype), w)

    def _slots(self) -> list[tuple[int, ...]]:
        """Shapes of the update slots: one per parameter, or one flat slot for all of them when fused."""
        if self.fused:
            return [(sum(as_int(p.numel()) for p in self.params),)]
        return [tuple(as_int(s) for s in p.shape) for p in self.params]

    def _compute_dtype(self) -> list[DType]:
        if self.fused:
            return [least_upper_dtype(OPTIM_DTYPE, *[p.dtype for p in self.params])]
        return [least_upper_dtype(OPTIM_DTYPE, p.dtype) for p in self.params]

    def _new_state(self, fill: float = 0.0) -> list[Tensor]:
        """A realized state tensor per slot, filled with `fill` (is_param=False: never a parameter itself)."""
        return [
            _placed_like(Tensor.full(shape, fill, dtype=dt, device=self.device if self.fused else p.device), p)
            .contiguous()
            .realize()
            .is_param_(False)
            for shape, dt, p in zip(self._slots(), self._compute_dtype(), self.params)
        ]

    def _weights_and_grads(self) -> list[tuple[Tensor, Tensor]]:
        """(detached value, gradient) per slot in the slot's compute dtype; fused: all flattened into one."""
        dts = self._compute_dtype()
        if not self.fused:
            return [(p.detach().cast(dt), _grad(p, dt)) for p, dt in zip(self.params, dts)]
        dt = dts[0]
        ws = [p.detach().cast(dt).flatten() for p in self.params]
        gs = [_grad(p, dt, contiguous=False).flatten() for p in self.params]
        return [(_cat(ws), _cat(gs).contiguous())]

    def _param_updates(self, news: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
        """(param, new value in its dtype) from the new value of each slot."""
        if not self.fused:
            return [(p, n.cast(p.dtype)) for p, n in zip(self.params, news)]
        out, off = [], 0
        for p in self.params:
            n = as_int(p.numel())
            out.append((p, news[0].shrink(((off, off + n),)).reshape(p.shape).cast(p.dtype)))
            off += n
        return out


def _beside(scalar: Tensor, w: Tensor) -> Tensor:
    """A step's scalar (learning rate, bias correction: kept on the optimizer's device) on the device of slot value w
    when that is another single device: one optimizer over a model split across devices updates each part where it
    lives."""
    return scalar.to(w.device) if isinstance(w.device, str) and scalar.device != w.device else scalar


def _placed_like(state: Tensor, p: Tensor) -> Tensor:
    """A state tensor of p's shape sharded like a sharded p (replicated state would not take sharded updates)."""
    if isinstance(p.uop, MultiUOp) and state.shape == p.shape:
        return state.shard_like(p)
    return state


def settle_deferred(*ts: Tensor) -> None:
    """Apply the deferred updates still pending on any of ts before new ones are built from them: in eager order a
    second BatchNorm call, or a second schedule_step(), before a realize builds on the first (tinygrad's assigns do);
    built from the old contents, it would replace the first update instead of following it."""
    if DEFERRED_ANY[0] and any(id(t) in _DEFERRED for t in ts):
        Tensor._realize_with_deferred(())


def _assign_later(target: Tensor, value: Tensor) -> None:
    """target takes value at the next realize, computed in that realize's schedule with every other queued update
    (so all of them read the values from before the step)."""
    value = value if value.dtype == target.dtype else value.cast(target.dtype)
    target.assign_deferred(_resharded_like(value, target))


def _resharded_like(x: Tensor, p: Tensor) -> Tensor:
    """x laid out over p's devices like p when both are sharded differently: a replicated bias's gradient comes out
    sharded when the layer's output was (its sum over the batch keeps the feature split), and the update of p (or
    of state placed like p) must have p's sharding."""
    xu, pu = x.uop, p.uop
    if isinstance(xu, MultiUOp) and isinstance(pu, MultiUOp) and (xu.axis != pu.axis or xu.device != pu.device):
        return x.shard_like(p)
    return x


def _owns_buffer(t: Tensor) -> bool:
    """t is a whole realized buffer (possibly reshaped), so an assign updates it in place (every shard of a sharded
    tensor)."""
    if isinstance(t.uop, MultiUOp):
        return t.uop.op is Ops.NOOP and all(_owns_buffer(Tensor(s, device=d)) for s, d in zip(t.uop.shards,
                                                                                            t.uop.device))  # fmt: skip
    bb = base_buffer(t.uop)
    if bb is None or view_offset(t.uop) != 0 or int(bb.arg) != as_int(t.numel()):
        return False
    u = t.uop
    while u.op is not Ops.BUFFER:
        if u.op is not Ops.RESHAPE:
            return False
        u = u.src[0]
    return True


def _grad(p: Tensor, dtype: DType, contiguous: bool = True) -> Tensor:
    assert p.grad is not None
    g = _resharded_like(p.grad.detach(), p)
    g = g.cast(dtype) if g.dtype != dtype else g
    # one kernel computes the gradient; updates that read it twice (Adam's m and v) share it
    return g.contiguous() if contiguous else g


def _cat(ts: list[Tensor]) -> Tensor:
    return ts[0] if len(ts) == 1 else ts[0].cat(*ts[1:])


def _norm(x: Tensor) -> Tensor:
    return x.square().sum().sqrt()


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. Muon for matrices and AdamW for the rest)."""

    def __init__(self, *optimizers: Optimizer) -> None:
        if not optimizers:
            raise OptimizerError("OptimizerGroup needs at least one optimizer")
        if bad := [o for o in optimizers if not isinstance(o, Optimizer)]:
            raise TensorTypeError(f"OptimizerGroup takes optimizers (OptimizerGroup(opt1, opt2)), got "
                                  f"{type(bad[0]).__name__} {bad[0]!r:.40}")  # fmt: skip
        self.optimizers = list(optimizers)
        self.params = [p for o in optimizers for p in o.params]
        self.buffers = [b for o in optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def schedule_step(self) -> list[Tensor]:
        return [t for o in self.optimizers for t in o.schedule_step()]


class LARS(Optimizer):
    """SGD with momentum and a layer-wise trust ratio r = tcoef*||w|| / (||g|| + wd*||w||) (1 when either norm is 0
    or tcoef is 0). Per step: g += wd*w (pre_wd); g *= r*lr (classic); b = momentum*b + g and g = g + momentum*b
    (nesterov) or b; g = NewtonSchulz(g) (ns_coefficients); w *= 1 - wd*lr (not pre_wd); g *= r*lr (not classic);
    w -= g."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        ns_steps: int = 0,
        ns_coefficients: Sequence[float] | None = None,
        nesterov: bool = False,
        classic: bool = True,
        pre_wd: bool = True,
        tcoef: float = 0.001,
        device: str | None = None,
        fused: bool | None = None,
    ) -> None:
        momentum, weight_decay = _hyper("momentum", momentum), _hyper("weight_decay", weight_decay)
        super().__init__(params, lr, device, fused)
        self.momentum, self.wd, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
        self.pre_wd, self.tcoef = pre_wd, tcoef
        if ns_coefficients is not None and not isinstance(ns_coefficients, (tuple, list)):  # ("not iterable")
            raise TensorTypeError(f"LARS: ns_coefficients must be a tuple of numbers (a, b, c) or None, got "
                                  f"{type(ns_coefficients).__name__} {ns_coefficients!r:.40}")  # fmt: skip
        self.ns_steps, self.ns_coefficients = ns_steps, tuple(ns_coefficients) if ns_coefficients else None
        self.b = self._new_state() if momentum else []

    def _state(self) -> list[Tensor]:
        return list(self.b)

    def _updates(self) -> list[tuple[Tensor, Tensor]]:
        out: list[tuple[Tensor, Tensor]] = []
        news = []
        for i, ((w, g), dt) in enumerate(zip(self._weights_and_grads(), self._compute_dtype())):
            lr = self._lr(dt, w)
            if self.tcoef:
                wn, gn = _norm(w), _norm(g)
                r = ((wn > 0) & (gn > 0)).where(wn * self.tcoef / (gn + wn * self.wd), 1.0)
                rlr = r * lr
            else:
                rlr = lr
            if self.pre_wd and self.wd > 0:
                g = g + w * self.wd
            if self.classic:
                g = g * rlr
            if self.momentum:
                b = self.b[i] * self.momentum + g
                out.append((self.b[i], b))
                g = g + b * self.momentum if self.nesterov else b
            if self.ns_coefficients:
                g = newton_schulz(g.reshape(g.shape[0], -1), self.ns_steps, self.ns_coefficients).reshape(g.shape)
            if not self.pre_wd and self.wd > 0:
                w = w * (1.0 - lr * self.wd)
            if not self.classic:
                g = g * rlr
            news.append(w - g)
        return out + self._param_updates(news)


def SGD(
    params: Sequence[Tensor],
    lr: float | Tensor = 0.001,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    classic: bool = False,
    device: str | None = None,
    fused: bool | None = None,
) -> LARS:
    """Stochastic gradient descent: b = momentum*b + (g + weight_decay*w); w -= lr*b (nesterov: lr*(g' + m*b))."""
    return LARS(
        params,
        lr,
        momentum,
        weight_decay,
        0,
        None,
        nesterov,
        classic,
        pre_wd=True,
        tcoef=0.0,
        device=device,
        fused=fused,
    )


def Muon(
    params: Sequence[Tensor],
    lr: float | Tensor = 0.001,
    momentum: float = 0.95,
    weight_decay: float = 0.1,
    ns_steps: int = 5,
    ns_coefficients: Sequence[float] = (3.4445, -4.775, 2.0315),
    nesterov: bool = True,
    device: str | None = None,
    fused: bool | None = None,
) -> LARS:
    """Muon: nesterov momentum whose update (each parameter seen as a (shape[0], -1) matrix) is orthogonalized by
    Newton-Schulz iterations, with decoupled weight decay."""
    if fused if fused is not None else FUSE_OPTIM:
        raise OptimizerError("Muon can't be fused: it orthogonalizes each parameter's update as a matrix of its own")
    return LARS(
        params,
        lr,
        momentum,
        weight_decay,
        ns_steps,
        ns_coefficients,
        nesterov,
        classic=False,
        pre_wd=False,
        tcoef=0.0,
        device=device,
        fused=False,
    )


def newton_schulz(
    g: Tensor, steps: int = 5, coefficients: Sequence[float] = (3.4445, -4.775, 2.0315), eps: float = 1e-7
) -> Tensor:
    """Approximately orthogonalize a matrix (its polar factor) with a quintic Newton-Schulz iteration."""
    a, b, c = coefficients
    transposed = g.shape[0] > g.shape[1]
    x = g.T if transposed else g
    x = x / (_norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = x * a + (s * b + (s @ s) * c) @ x
    return x.T if transposed else x


class LAMB(Optimizer):
    """LAMB: Adam moments with a layer-wise trust ratio r = ||w|| / ||u|| (1 when either is 0, or with adam=True,
    which makes it Adam with decoupled weight decay, AdamW). u = m_hat / (sqrt(v_hat) + eps) + wd*w; w -= lr*r*u."""

    def __init__(
        self,
        params: Sequence[Tensor],
        lr: float | Tensor = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        device: str | None = None,
        fused: bool | None = None,
    ) -> None:
        weight_decay, eps = _hyper("weight_decay", weight_decay), _hyper("eps", eps)
        b1, b2 = _hyper("b1", b1, below=1.0), _hyper("b2", b2, below=1.0)
        super().__init__(params, lr, device, fused)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        self.b1_t, self.b2_t = (
            Tensor.ones((1,), dtype=dtypes.float32, device=self.device).contiguous().realize().is_param_(False)
            for _ in range(2)
        )
        self.m, self.v = self._new_state(), self._new_state()

    def _state(self) -> list[Tensor]:
        return [self.b1_t, self.b2_t, *self.m, *self.v]

    def _updates(self) -> list[tuple[Tensor, Tensor]]:
        b1_t, b2_t = self.b1_t * self.b1, self.b2_t * self.b2
        out = [(self.b1_t, b1_t), (self.b2_t, b2_t)]
        news = []
        for i, ((w, g), dt) in enumerate(zip(self._weights_and_grads(), self._compute_dtype())):
            c1, c2 = _beside((1.0 - b1_t).reshape(()).cast(dt), w), _beside((1.0 - b2_t).reshape(()).cast(dt), w)
            lr = self._lr(dt, w)
            m = self.m[i] * self.b1 + g * (1.0 - self.b1)
            v = self.v[i] * self.b2 + (g * g) * (1.0 - self.b2)
            out += [(self.m[i], m), (self.v[i], v)]
            # the bias corrections as scalars, once per step: (m/c1) / (sqrt(v/c2) + eps) equals
            # m * (sqrt(c2)/c1) / (sqrt(v) + eps*sqrt(c2)), which costs an element one sqrt and one division instead
            # of three divisions and a sqrt (the scalar factors are loop-invariant in the update kernel)
            s2 = c2.sqrt()
            k, e = s2 / c1, s2 * self.eps
            if self.adam:  # lr folds into the scalar factor; weight decay costs nothing when it is 0
                up = m * (lr * k) / (v.sqrt() + e)
                news.append(w - (up + w * (lr * self.wd) if self.wd else up))
            else:
                u = m * k / (v.sqrt() + e) + w * self.wd
                wn, un = _norm(w), _norm(u)
                r = ((wn > 0) & (un > 0)).where(wn / un, 1.0)
                news.append(w - lr * r * u)
        return out + self._param_updates(news)


def Adam(
    params: Sequence[Tensor],
    lr: float | Tensor = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """Adam: bias-corrected first and second moments, w -= lr * m_hat / (sqrt(v_hat) + eps)."""
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)


def AdamW(
    params: Sequence[Tensor],
    lr: float | Tensor = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    device: str | None = None,
    fused: bool | None = None,
) -> LAMB:
    """Adam with decoupled weight decay: w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


__all__ = [
    "LAMB",
    "LARS",
    "SGD",
    "Adam",
    "AdamW",
    "Muon",
    "Optimizer",
    "OptimizerError",
    "OptimizerGroup",
    "newton_schulz",
]
