"""Autograd for Tensor: `backward()`, `Tensor.gradient(*targets)`, training mode.

Gradients are lazy tensors built by speck.tensor.gradient from the tensor-level UOp graph; nothing runs until they
are realized (usually by the optimizer step, together with the parameter updates).

Which tensors `backward()` fills: every live tensor object (speck.tensor.live) whose node is in the root's graph,
whose dtype is floating point and which has a device - parameters, inputs, intermediates held in variables and the
root itself (it gets 1). No flag is needed; `requires_grad=False` and `detach()` opt out."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from speck.tensor import live
from speck.tensor.dims import tensor_args
from speck.tensor.errors import GradientError, TensorTypeError
from speck.tensor.errors import GradientSeedError as GradientSeedError
from speck.tensor.gradient import compute_gradient
from speck.tensor.multi import MultiUOp
from speck.tensor.schedule import add_siblings, base_buffer
from speck.tensor.writes import buffers_read, rebinding
from speck.uop import Ops, UOp, dtypes

if TYPE_CHECKING:
    from speck.tensor.tensor import Tensor


def _seed(root: Tensor, gradient: Tensor | None, what: str) -> UOp:
    """The gradient flowing into root: 1 for a scalar root, else the given seed (same shape)."""
    if gradient is None:
        if root.shape != ():
            raise GradientSeedError(
                f"{what} of a tensor of shape {root.shape} needs an explicit `gradient=` seed of that shape; "
                "reduce it to a scalar first (e.g. .sum())"
            )
        one = UOp(Ops.CONST, root.dtype, (UOp(Ops.DEVICE, arg=root.device),), 1.0)
        return one
    if not isinstance(gradient, type(root)):  # ("'float' object has no attribute 'shape'")
        raise TensorTypeError(f"{what}: the `gradient=` seed must be a Tensor of shape {root.shape}, got "
                              f"{type(gradient).__name__} {gradient!r:.40}; wrap it with Tensor(...)")  # fmt: skip
    if gradient.shape != root.shape:
        # a seed with the root's elements in another shape ([3.0] for a 0-d root), or one that broadcasts to it
        if gradient.numel() == root.numel():
            gradient = gradient.reshape(root.shape)
        else:
            try:
                gradient = gradient.expand(root.shape)
            except (ValueError, IndexError, RuntimeError):
                raise GradientSeedError(f"{what}: the seed gradient has shape {gradient.shape}, which doesn't "
                                        f"broadcast to the root's shape {root.shape}") from None  # fmt: skip
    return gradient.uop if gradient.dtype == root.dtype else gradient.uop.cast(root.dtype)


def _check_float(t: Tensor, role: str) -> None:
    if not dtypes.is_float(t.dtype):
        raise GradientError(
            f"only float Tensors have gradient: the {role} is {t.dtype} (gradients need a float dtype; "
            "cast it with .float() first)"
        )
    if t.dtype.is_weak:
        raise GradientError(
            f"cannot take gradient wrt a weak Tensor (the {role} has dtype {t.dtype}, a Python-literal dtype with "
            "no storage width); cast it to a concrete float dtype first"
        )


# each @function call's outputs -> the call's explicit inputs: backward() gives every input of a call in the graph
# a .grad (zeros for one the body does not use: TENSOR_API 13.1), although the instantiated body only reads the
# used ones
CALL_INPUTS: weakref.WeakKeyDictionary[UOp, tuple[UOp, ...]] = weakref.WeakKeyDictionary()


def _grad_or_zeros(grads: dict[UOp, UOp], t: Tensor) -> UOp:
    """t's gradient, or zeros of its shape when the root does not depend on it (only through detach())."""
    if (g := grads.get(t.uop)) is not None:
        return g
    z = UOp(Ops.CONST, t.dtype, (UOp(Ops.DEVICE, arg=t.device),), 0.0)
    return z.reshape((1,) * len(t.shape)).expand(t.shape) if t.shape else z


def _may_be_in(t: Tensor, root_reads: set[UOp] | None) -> bool:
    """False when t's graph (as Tensor.uop would rebind it) reads a buffer the root's graph does not: then it is not
    a node of the root's graph, and t.uop need not rebuild a stale graph to find that out."""
    if root_reads is None or isinstance(t._uop, MultiUOp) or not (swap := rebinding(t)):
        return True
    return all(swap.get(b, b) in root_reads for b in buffers_read(t._uop))


def _on_own_device(g: UOp, t: Tensor) -> UOp:
    """A one-device tensor whose node is also in a sharded graph (nodes are interned: a constant such as a previous
    loss's seed 1.0) gets a sharded gradient from it; it is gathered to the tensor's own device."""
    if isinstance(g, MultiUOp) and not isinstance(t.uop, MultiUOp) and isinstance(t.device, str):
        return g.to_device(t.device)
    return g


def gradient(root: Tensor, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(root)/d(target) for each target, as lazy tensors with the target's shape (0-d included); `.grad` is not
    touched. Root and targets must be concrete floats (RuntimeError); a non-scalar root needs `gradient=`."""
    _check_float(root, "tensor being differentiated")
    tensor_args("gradient", "target", targets, type(root))
    for t in targets:
        _check_float(t, "target")
    seed = _seed(root, gradient, "gradient()")
    grads = compute_gradient(root.uop, seed, [t.uop for t in targets])
    # a target the root does not depend on gets device-less zeros of its shape (they take any device they meet)
    return [type(root)(g, device=t.device) if (g := grads.get(t.uop)) is not None else
            type(root).full(t.shape, 0.0, dtype=t.dtype, buffer=False) for t in targets]  # fmt: skip


# tensors that needed gradients (requires_grad True) when realize() replaced their graph by their buffer: a backward()
# from one reaches nothing of what it was computed from and would silently fill no .grad. By id, holding the tensor
# weakly (a WeakSet compares members with Tensor.__eq__, which is elementwise)
realized_roots: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


def backward(root: Tensor, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(root)/d(t) into t.grad for every live float tensor t in root's graph (see the module doc);
    returns root."""
    seed = _seed(root, gradient, "backward()")
    _check_float(root, "tensor backward() starts from")
    if realized_roots.get(id(root)) is root and not isinstance(u := root.uop, MultiUOp) and base_buffer(u) is not None:
        raise GradientError("backward(): this tensor was realized before it, and realize() replaced its graph by its "
                            "buffer, so no gradient can reach the tensors it was computed from; call backward() "
                            "before realize(), or read the value with .item()/.numpy()/.tolist(), which keep the "
                            "graph")  # fmt: skip
    nodes = set(root.uop.toposort())
    # the buffers the root's graph reads (None: a sharded root, whose logical graph is not what its shards read)
    root_reads: set[UOp] | None = None if isinstance(root.uop, MultiUOp) else set(buffers_read(root.uop))
    if CALL_INPUTS:
        extra = [u for n in list(nodes) if (ins := CALL_INPUTS.get(n)) is not None for u in ins]
        nodes.update(extra)
        if root_reads is not None:
            root_reads.update(*(buffers_read(u) for u in extra))
    # (a tensor with a deferred update pending, marked by a negative _ver, is skipped without reading its uop, which
    # would apply the update in a schedule of its own: its new value is no node of a graph built before the update)
    targets = [
        t
        for t in live.tensors()
        if t.requires_grad is not False and t._ver >= 0 and _may_be_in(t, root_reads) and t.uop in nodes
        and t.device is not None and dtypes.is_float(t.dtype)
    ]  # fmt: skip
    for t in targets:
        if t.dtype.is_weak:
            _check_float(t, "tensor in the graph")
    grads = compute_gradient(root.uop, seed, [t.uop for t in targets])
    made = []
    for t in targets:
        g = type(root)(_on_own_device(_grad_or_zeros(grads, t), t), device=t.device)
        made.append(g)
        if t.grad is None:
            t.grad = g
        else:  # accumulate in place, so every holder of the .grad object sees the sum
            t.grad.assign(t.grad + g)
    # (read one at a time, they share what the first read computes: schedule.add_siblings; a gradient that reads no
    # buffer, the root's 1.0, shares nothing, and its interned constant would outlive the others)
    add_siblings([u for g in made if isinstance(u := g.uop, UOp) and u.op is not Ops.BUFFER and buffers_read(u)])
    return root
