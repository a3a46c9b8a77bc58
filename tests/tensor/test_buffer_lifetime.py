"""Buffers die with the last graph or tensor that holds them: speck's own memo tables (what a graph reads) never
keep one alive, so an eager training loop's memory stays flat from step to step."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from speck.tensor import GlobalCounters, Tensor, nn
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
