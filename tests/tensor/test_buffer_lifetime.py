"""Buffers die with the last graph or tensor that holds them: speck's own memo tables (what a graph reads) never
keep one alive, so an eager training loop's memory stays flat from step to step."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from speck.tensor import GlobalCounters, Tensor, nn
from speck.tensor.gradient import _OVERRIDES
from speck.tensor.nn.optim import SGD
from speck.tensor.nn.state import get_parameters
from speck.tensor.writes import buffers_read


def test_asking_what_a_buffer_reads_does_not_keep_it_alive():
    t = Tensor(np.arange(6, dtype=np.float32)).realize()
    buf = t.uop.base if t.uop.op.name != "BUFFER" else t.uop
    while buf.op.name != "BUFFER":
        buf = buf.src[0]
    assert buffers_read(buf) == frozenset((buf,))
    assert buffers_read((t + 1).uop) == frozenset((buf,))
    ref = weakref.ref(buf)
    del t, buf
    gc.collect()
    assert ref() is None


def test_an_eager_conv_training_loop_holds_no_more_memory_per_step():
    Tensor.manual_seed(0)
    model = [nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), lambda t: t.relu().max_pool2d().mean(axis=(2, 3)), nn.Linear(8, 2)]
    opt = SGD(get_parameters(model), lr=0.01)
    rng = np.random.default_rng(0)
    used = []
    with Tensor.train():
        for _ in range(8):
            opt.zero_grad()
            loss = Tensor(rng.random((16, 3, 12, 12), dtype=np.float32)).sequential(model).sum()
            loss.backward()
            opt.step()
            loss.item()
            del loss
            gc.collect()
            used.append(GlobalCounters.mem_used)
    assert used[-1] <= used[3], used  # (steps 0-3 warm caches and optimizer state up)


OPS = {
    "conv2d": lambda x, w: x.conv2d(w, padding=1),
    "conv2d_strided": lambda x, w: x.conv2d(w, stride=2),
    "conv_transpose2d": lambda x, w: x.conv_transpose2d(w.permute(1, 0, 2, 3)),
    "max_pool2d": lambda x, w: x.max_pool2d(),
    "relu": lambda x, w: x.relu(),
    "sigmoid": lambda x, w: x.sigmoid(),
    "pow": lambda x, w: x.abs() ** w.sum(),
    "unpool": lambda x, w: Tensor.max_unpool2d(*x.max_pool2d(return_indices=True)),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_gradient_rules_die_with_their_graph(op: str) -> None:
    gc.collect()
    before = len(_OVERRIDES)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 6, 6), dtype=np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal((3, 3, 3, 3), dtype=np.float32) * 0.1, requires_grad=True)
    out = OPS[op](x, w)
    out.sum().backward()  # the inputs now hold gradients built from the rules
    assert x.grad is not None
    Tensor.realize(*(t.grad for t in (x, w) if t.grad is not None))  # (a lazy .grad may read the node: pow's does)
    assert len(_OVERRIDES) > before or op not in ("conv2d", "relu", "max_pool2d")
    del out
    gc.collect()
    assert len(_OVERRIDES) == before  # x, w and their .grad alive: still no entry kept
