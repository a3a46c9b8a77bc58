"""Autograd for Tensor: `backward()`, `Tensor.gradient(*targets)`, training mode and no-grad evaluation.

Gradients are lazy tensors built by speck.tensor.gradient from the tensor-level UOp graph; nothing runs until they
are realized (usually by the optimizer step, together with the parameter updates)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from speck.tensor.gradient import compute_gradient
from speck.tensor.settings import TRAINING
from speck.uop import Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor

# tensors that asked for gradients; backward() fills .grad of those that the loss depends on
grad_tensors: weakref.WeakSet[Tensor] = weakref.WeakSet()


def register(t: Tensor) -> None:
    """Remember a tensor that requires gradients (called when requires_grad becomes True)."""
    grad_tensors.add(t)


def is_training() -> bool:
    from speck.tensor.tensor import Tensor

    return bool(Tensor.training) or bool(TRAINING)


@contextlib.contextmanager
def train(mode: bool = True) -> Iterator[None]:
    """Training mode for the block: dropout is active, batch-norm updates its running statistics, and optimizer
    steps are allowed. Same as Context(TRAINING=1)."""
    from speck.tensor.tensor import Tensor

    old, old_cv = Tensor.training, TRAINING.value
    Tensor.training, TRAINING.value = mode, int(mode)
    try:
        yield
    finally:
        Tensor.training, TRAINING.value = old, old_cv


def _seed(t: Tensor) -> UOp:
    """d(t)/d(t) = 1, as a constant of t's dtype and shape on t's device."""
    one = UOp(Ops.CONST, t.dtype, (UOp(Ops.DEVICE, arg=t.device),), 1.0 if dtypes.is_float(t.dtype) else 1)
    return one.reshape((1,) * len(t.shape)).expand(t.shape) if t.shape else one


def gradient(root: Tensor, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """Gradients of `root` with respect to each target (lazy tensors). A scalar root needs no seed gradient."""
    from speck.tensor.tensor import Tensor

    if gradient is None:
        if root.shape != ():
            raise RuntimeError(
                f"gradient of a non-scalar tensor (shape {root.shape}) needs an explicit `gradient=` seed of that "
                "shape; reduce it to a scalar (e.g. .sum()) first"
            )
        seed = _seed(root)
    else:
        if gradient.shape != root.shape:
            raise RuntimeError(f"seed gradient has shape {gradient.shape}, expected {root.shape}")
        seed = gradient.uop
    if not dtypes.is_float(root.dtype):
        raise RuntimeError(f"can't differentiate a {root.dtype} tensor: gradients need a float dtype")
    grads = compute_gradient(root.uop, seed, [t.uop for t in targets])
    out = []
    for t in targets:
        g = grads.get(t.uop)
        if g is None:
            raise RuntimeError(
                f"a target of shape {t.shape} does not contribute to the tensor being differentiated; "
                "its gradient is undefined (check that it was used, and not detach()ed)"
            )
        out.append(Tensor(g, device=t.device))
    return out


def backward(root: Tensor, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(root)/d(t) into t.grad for every tensor t with requires_grad=True that root depends on."""
    nodes = set(root.uop.toposort())
    targets = [t for t in list(grad_tensors) if t.requires_grad and t.uop in nodes]
    if not targets:
        raise RuntimeError(
            "backward() found no tensor with requires_grad=True that this value depends on; create parameters "
            "with requires_grad=True (optimizers set it for the parameters they get)"
        )
    grads = _gradients_by_uop(root, targets, gradient)
    for t in targets:
        g = grads.get(t.uop)
        if g is None:
            continue
        t.grad = g if t.grad is None else t.grad + g
    return root


def _gradients_by_uop(root: Tensor, targets: list[Tensor], gradient: Tensor | None) -> dict[UOp, Tensor]:
    from speck.tensor.tensor import Tensor

    seed = _seed(root) if gradient is None else gradient.uop
    if gradient is None and root.shape != ():
        raise RuntimeError(f"backward() on a tensor of shape {root.shape} needs `gradient=`; call .sum() first")
    raw = compute_gradient(root.uop, seed, [t.uop for t in targets])
    return {u: Tensor(g, device=root.device) for u, g in raw.items()}
