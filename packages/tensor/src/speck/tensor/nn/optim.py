"""Optimizers: SGD (momentum, nesterov, weight decay), Adam, AdamW, LAMB, LARS, Muon, and OptimizerGroup.

`step()` builds the new value of every parameter and state tensor lazily from the *old* values (so every gradient
sees the parameters before the update), realizes them together in one schedule, then assigns them; it returns
nothing and refuses to run outside training mode (`Tensor.train()` or `Context(TRAINING=1)`): a step in evaluation
mode is almost always a bug. State (momentum buffers, the step count) lives in tensors, so a TinyJit-captured step
replays correctly."""

from __future__ import annotations

import math
from collections.abc import Sequence

from speck.tensor.dims import as_int
from speck.tensor.tensor import Tensor
from speck.uop import DType, dtypes


class Optimizer:
    """Base class: holds the parameters that require gradients and the shared learning rate tensor."""

    def __init__(self, params: Sequence[Tensor], lr: float) -> None:
        for p in params:
            if p.requires_grad is None:
                p.requires_grad = True
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise RuntimeError("optimizer got no parameters that require gradients; pass model parameters")
        self.buffers = [p for p in params if not p.requires_grad]
        # parameters must live in buffers of their own: assign() then updates them in place, and a TinyJit capture
        # of the step sees the same kernels on every call (a lazy initialiser would be folded into the first one)
        for p in self.params:
            if not _owns_buffer(p):
                p.uop = p.contiguous().realize().uop
        self.lr = Tensor([lr], dtype=dtypes.float32, requires_grad=False).contiguous().realize()

    def zero_grad(self) -> None:
        """Forget the gradients of every parameter."""
        for p in self.params:
            p.grad = None

    def step(self, *realize_with: Tensor) -> None:
        """Apply one update to every parameter: realize all new values together, then assign them. `realize_with`
        tensors (e.g. the loss) are computed in the same schedule, from the parameters before the update."""
        updates = self.schedule_step()
        Tensor.realize_all(*realize_with, *[new for _, new in updates])
        for target, new in updates:
            target.assign(new)

    def schedule_step(self) -> list[tuple[Tensor, Tensor]]:
        """(target, lazy new value) for every tensor one step updates (parameters and optimizer state), computed
        from the current values; nothing is realized or assigned."""
        from speck.tensor.autograd import is_training

        if not is_training():
            raise RuntimeError(
                "optimizer step outside training mode: wrap the training step in `with Tensor.train():` "
                "(or Context(TRAINING=1)); evaluation must not update parameters"
            )
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:
            raise RuntimeError(
                f"parameters {missing} of {len(self.params)} have no gradient; call loss.backward() before step(), "
                "and check that every parameter contributes to the loss"
            )
        return self._step()

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        raise NotImplementedError

    def _lr(self, dtype: DType) -> Tensor:
        """The learning rate as a 0-d tensor of dtype (so it broadcasts to any parameter shape, 0-d included)."""
        return self.lr.reshape(()).cast(dtype)


def _owns_buffer(t: Tensor) -> bool:
    """t is a whole realized buffer (possibly reshaped), so assign() updates it in place."""
    from speck.tensor.schedule import base_buffer, view_offset
    from speck.uop import Ops

    bb = base_buffer(t.uop)
    if bb is None or view_offset(t.uop) != 0 or int(bb.arg) != as_int(t.numel()):
        return False
    u = t.uop
    while u.op is not Ops.BUFFER:
        if u.op is not Ops.RESHAPE:
            return False
        u = u.src[0]
    return True


def _grad(p: Tensor) -> Tensor:
    assert p.grad is not None
    g = p.grad.detach().cast(p.dtype) if p.grad.dtype != p.dtype else p.grad.detach()
    return g.contiguous()  # one kernel computes the gradient; updates that read it twice (Adam m and v) share it


class OptimizerGroup(Optimizer):
    """Several optimizers stepped as one (e.g. Muon for matrices and AdamW for the rest)."""

    def __init__(self, *optimizers: Optimizer) -> None:
        self.optimizers = list(optimizers)
        self.params = [p for o in optimizers for p in o.params]
        self.buffers = [b for o in optimizers for b in o.buffers]

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        return [u for o in self.optimizers for u in o._step()]


class SGD(Optimizer):
    """Stochastic gradient descent: g = grad + weight_decay*p; with momentum b = momentum*b + g and the update uses b
    (or g + momentum*b with nesterov); p -= lr * update."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:  # fmt: skip
        super().__init__(params, lr)
        if nesterov and momentum == 0:
            raise RuntimeError("nesterov momentum needs momentum > 0")
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.b = [Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device).contiguous().realize() for p in self.params] \
            if momentum else []  # fmt: skip

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for i, p in enumerate(self.params):
            g = _grad(p)
            if self.wd:
                g = g + p.detach() * self.wd
            if self.momentum:
                b = self.b[i] * self.momentum + g
                out.append((self.b[i], b))
                g = g + b * self.momentum if self.nesterov else b
            out.append((p, p.detach() - g * self._lr(p.dtype)))
        return out


class LAMB(Optimizer):
    """LAMB (Adam moments with a layer-wise trust ratio); with adam=True the trust ratio is 1, which is Adam with
    decoupled weight decay (AdamW)."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False) -> None:  # fmt: skip
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        self.b1_t = Tensor([1.0], dtype=dtypes.float32).contiguous().realize()
        self.b2_t = Tensor([1.0], dtype=dtypes.float32).contiguous().realize()
        self.m = [Tensor.zeros(*p.shape, dtype=dtypes.float32, device=p.device).contiguous().realize()
                  for p in self.params]  # fmt: skip
        self.v = [Tensor.zeros(*p.shape, dtype=dtypes.float32, device=p.device).contiguous().realize()
                  for p in self.params]  # fmt: skip

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        b1_t, b2_t = self.b1_t * self.b1, self.b2_t * self.b2
        out = [(self.b1_t, b1_t), (self.b2_t, b2_t)]
        c1, c2 = (1.0 - b1_t).reshape(()), (1.0 - b2_t).reshape(())
        lr = self._lr(dtypes.float32)
        # the bias corrections as scalars, once per step: (m/c1) / (sqrt(v/c2) + eps) equals
        # m * (sqrt(c2)/c1) / (sqrt(v) + eps*sqrt(c2)), which costs an element one sqrt and one division instead
        # of three divisions and a sqrt (the scalar factors are loop-invariant in the update kernel)
        s2 = c2.sqrt()
        k, e = s2 / c1, s2 * self.eps
        for i, p in enumerate(self.params):
            g = _grad(p).float()
            m = self.m[i] * self.b1 + g * (1.0 - self.b1)
            v = self.v[i] * self.b2 + (g * g) * (1.0 - self.b2)
            pf = p.detach().float()
            if self.adam:  # lr folds into the scalar factor; weight decay costs nothing when it is 0
                step = m * (lr * k) / (v.sqrt() + e)
                new = pf - (step + pf * (lr * self.wd) if self.wd else step)
            else:
                up = m * k / (v.sqrt() + e) + pf * self.wd
                r1, r2 = pf.square().sum().sqrt(), up.square().sum().sqrt()
                trust = ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
                new = pf - lr * trust * up
            out += [(self.m[i], m), (self.v[i], v), (p, new.cast(p.dtype))]
        return out


def Adam(params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> LAMB:
    """Adam: bias-corrected first and second moments, p -= lr * m_hat / (sqrt(v_hat) + eps)."""
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True)


def AdamW(params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> LAMB:  # fmt: skip
    """Adam with decoupled weight decay: p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p)."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True)


class LARS(Optimizer):
    """SGD with momentum and a layer-wise trust ratio: local_lr = tcoef*||p|| / (||g|| + wd*||p||) scales
    g = grad + wd*p before the momentum update."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 0.0,
                 tcoef: float = 0.001) -> None:  # fmt: skip
        super().__init__(params, lr)
        self.momentum, self.wd, self.tcoef = momentum, weight_decay, tcoef
        self.b = [Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device).contiguous().realize() for p in self.params]

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        for i, p in enumerate(self.params):
            g, pd = _grad(p), p.detach()
            pn, gn = pd.square().sum().sqrt(), g.square().sum().sqrt()
            trust = ((pn > 0) & (gn > 0)).where(pn * self.tcoef / (gn + pn * self.wd), 1.0)
            g = (g + pd * self.wd) * trust
            b = self.b[i] * self.momentum + g
            out += [(self.b[i], b), (p, pd - b * self._lr(p.dtype))]
        return out


def newton_schulz(g: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Approximately orthogonalize a matrix (the polar factor) with a quintic Newton-Schulz iteration."""
    a, b, c = 3.4445, -4.7750, 2.0315
    transposed = g.shape[0] > g.shape[1]
    x = g.T if transposed else g
    x = x / (x.square().sum().sqrt() + eps)
    for _ in range(steps):
        s = x @ x.T
        x = x * a + (s * b + (s @ s) * c) @ x
    return x.T if transposed else x


class Muon(Optimizer):
    """Muon: SGD-momentum whose update for each 2-D parameter is orthogonalized by Newton-Schulz and scaled by
    sqrt(max(1, rows/cols)); parameters that are not matrices get the plain momentum update."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0) -> None:  # fmt: skip
        super().__init__(params, lr)
        self.momentum, self.nesterov, self.ns_steps, self.wd = momentum, nesterov, ns_steps, weight_decay
        self.b = [Tensor.zeros(*p.shape, dtype=dtypes.float32, device=p.device).contiguous().realize()
                  for p in self.params]  # fmt: skip

    def _step(self) -> list[tuple[Tensor, Tensor]]:
        out = []
        lr = self._lr(dtypes.float32)
        for i, p in enumerate(self.params):
            g = _grad(p).float()
            b = self.b[i] * self.momentum + g
            up = g + b * self.momentum if self.nesterov else b
            if len(p.shape) == 2:
                up = newton_schulz(up, self.ns_steps) * math.sqrt(max(1.0, as_int(p.shape[0]) / as_int(p.shape[1])))
            pf = p.detach().float()
            # decoupled weight decay: p*(1 - lr*wd) - lr*up == p - lr*(up + wd*p)
            new = pf - lr * (up + pf * self.wd) if self.wd else pf - lr * up
            out += [(self.b[i], b), (p, new.cast(p.dtype))]
        return out
