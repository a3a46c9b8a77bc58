"""The main job: train the classic small CNN on Fashion-MNIST on the default device with Adam under TinyJit,
evaluate on the test set, print accuracy and throughput, and save the weights as safetensors.

    speck-train                      # or: python -m speck.tensor.examples.train
    speck-train --steps 200 --batch 128 --out weights.safetensors
    speck-train --devices 2          # data-parallel over CPU:0 and CPU:1 (each gets half of every batch)
    speck-train --device USB:SIM --steps 20 --batch 32   # on the simulated USB GPU (kernels in the RDNA3 emulator)
    mpiexec -n 2 speck-train --distributed   # data-parallel over 2 processes (or hosts) with MPI
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from speck.tensor import Context, Device, Tensor, TinyJit, distributed, dtypes, nn
from speck.tensor.dims import as_int
from speck.tensor.nn.datasets import mnist
from speck.tensor.nn.optim import Adam
from speck.tensor.nn.state import get_parameters, get_state_dict, safe_save


class Model:
    """Conv 5x5x32 x2, BatchNorm, maxpool, Conv 3x3x64 x2, BatchNorm, maxpool, Linear 576->10."""

    def __init__(self) -> None:
        self.c1, self.c2 = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 32, 5)
        self.bn1 = nn.BatchNorm(32)
        self.c3, self.c4 = nn.Conv2d(32, 64, 3), nn.Conv2d(64, 64, 3)
        self.bn2 = nn.BatchNorm(64)
        self.fc = nn.Linear(576, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn1(self.c2(self.c1(x).relu()).relu()).max_pool2d()
        x = self.bn2(self.c4(self.c3(x).relu()).relu()).max_pool2d()
        return self.fc(x.flatten(1))


class SmallModel:
    """A much smaller CNN (Conv 3x3x8 s2, Conv 3x3x16 s2, BatchNorm, maxpool, Linear 144->10): about 1/50 of the
    classic CNN's work per image, for quicker checks of the convolutional path."""

    def __init__(self) -> None:
        self.c1, self.c2 = nn.Conv2d(1, 8, 3, stride=2), nn.Conv2d(8, 16, 3, stride=2)
        self.bn = nn.BatchNorm(16)
        self.fc = nn.Linear(144, 10)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.c2(self.c1(x).relu())).relu().max_pool2d()
        return self.fc(x.flatten(1))


class MLP:
    """784-128-10 multilayer perceptron."""

    def __init__(self) -> None:
        self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.l1(x.flatten(1)).relu())


MODELS: dict[str, Callable[[], Callable[[Tensor], Tensor]]] = {"cnn": Model, "small-cnn": SmallModel, "mlp": MLP}
# The main job's convolutions: Winograd where it pays off (speck.tensor.winograd; the library's default, WINO=0, is
# the direct convolution, as tinygrad's). Its conv2 forward and gradients take ~0.6x the direct kernels' time; its
# results differ from the direct sum by a few 1e-6 of the largest output (the direct sum: a few 1e-7).
MAIN_JOB_WINO = 1


def main(argv: list[str] | None = None) -> float:
    """Train, evaluate and save; returns the test accuracy."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    ap.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    ap.add_argument("--lr", type=float, default=0.002, help="peak learning rate (default 0.002)")
    ap.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                    help="learning rate over the steps: cosine decay to 0 (default) or constant")  # fmt: skip
    ap.add_argument("--train-subset", type=int, default=0, help="use only the first N training images (0: all)")
    ap.add_argument("--test-subset", type=int, default=0, help="evaluate on the first N test images (0: all)")
    ap.add_argument("--out", default="fashion_cnn.safetensors", help="where to save the weights ('' to skip)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--model", choices=sorted(MODELS), default="cnn", help="cnn: the classic CNN (default)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--wino", type=int, choices=(0, 1, 2), default=MAIN_JOB_WINO,
                    help=f"Winograd convolutions: 0 none, 1 where they pay off (default {MAIN_JOB_WINO}), 2 all "
                    "eligible (the WINO setting for this run)")  # fmt: skip
    ap.add_argument(
        "--devices",
        default="1",
        help="data-parallel over N CPU devices (CPU:0..N-1) or a comma-separated "
        "list of devices: parameters replicated, each batch split between them, gradients allreduced",
    )
    ap.add_argument("--device", default="", help="the one device to train on (default: DEV, else CPU), e.g. USB:SIM")
    ap.add_argument("--distributed", action="store_true", help="data-parallel over the processes of an MPI job "
                    "(start with mpiexec; needs speck-tensor[mpi]): each rank takes its share of every batch, "
                    "gradients are averaged with MPI's allreduce; rank 0 prints, evaluates and saves")  # fmt: skip
    args = ap.parse_args(argv)
    if args.device and args.devices != "1":
        ap.error("--device and --devices exclude each other: one device, or a data-parallel list")
    with Context(WINO=args.wino), Context(**({"DEV": Device.canonicalize(args.device)} if args.device else {})):
        return _main(args, ap)


def _main(args: Any, ap: argparse.ArgumentParser) -> float:
    devices = parse_devices(args.devices)
    dist: Any = distributed if args.distributed else None
    if dist is not None:
        dist.init()
        if args.batch % dist.world_size():
            ap.error(f"--batch {args.batch} must split evenly over the {dist.world_size()} ranks")
    rank, ranks = (dist.rank(), dist.world_size()) if dist is not None else (0, 1)
    if len(devices) > 1 and (args.batch % len(devices) or 500 % len(devices)):
        ap.error(
            f"--batch {args.batch} (and the evaluation batch of 500) must split evenly over {len(devices)} devices"
        )
    from tqdm import trange

    Tensor.manual_seed(args.seed)
    X_train, Y_train, X_test, Y_test = mnist(fashion=True)
    if args.train_subset:
        X_train, Y_train = X_train[: args.train_subset].contiguous().realize(), Y_train[: args.train_subset].realize()
    if args.test_subset:
        X_test, Y_test = X_test[: args.test_subset].contiguous().realize(), Y_test[: args.test_subset].realize()
    model = MODELS[args.model]()
    if len(devices) > 1:  # every parameter and statistic replicated on every device
        for p in get_parameters(model):
            p.shard_(devices).realize()
    opt = Adam(get_parameters(model), lr=args.lr)
    n_train = as_int(X_train.shape[0])
    if dist is not None:  # every rank starts from rank 0's weights
        dist.broadcast_(get_parameters(model))

    def place(t: Tensor) -> Tensor:
        """A batch split over the devices (batch axis), or as it is on one device."""
        return t.shard(devices, axis=0) if len(devices) > 1 else t

    @TinyJit
    def train_step(idx: Tensor) -> tuple[Tensor, Tensor]:
        # the batch is gathered inside the jitted step: its kernel replays with the new indices, where a gather
        # outside would be scheduled anew on every step (2 ms of Python per step)
        x, y = place(X_train[idx]), place(Y_train[idx])
        with Tensor.train():
            opt.zero_grad()
            out = model(x.float() * (1 / 255.0) - 0.5)
            loss = out.sparse_categorical_crossentropy(y)
            loss.backward()
            acc = (out.argmax(axis=1) == y).float().mean()
            if dist is not None:  # this rank's gradients (with loss and accuracy, one schedule), averaged over ranks
                Tensor.realize_all(loss, acc, *[p.grad for p in opt.params if p.grad is not None])
                dist.allreduce_([p.grad for p in opt.params if p.grad is not None], op="mean")
            opt.step(loss, acc)  # loss and accuracy come from the same schedule, before the update
        return loss, acc

    @TinyJit
    def predict(x: Tensor) -> Tensor:
        return model(x.float() * (1 / 255.0) - 0.5).argmax(axis=1).realize()

    rng = np.random.default_rng(args.seed)
    t_start = time.perf_counter()
    bar = trange(args.steps, desc="train", unit="step", disable=args.quiet or rank != 0)
    try:
        losses = _train_loop(args, bar, opt, train_step, rng, n_train, rank, ranks, t_start)
    except Exception as e:
        if dist is None or not isinstance(e, dist.DistributedError):
            raise
        print(f"speck-train: {e}", file=sys.stderr)
        dist.abort(1)
    images = args.steps * args.batch
    train_s = time.perf_counter() - t_start
    if dist is not None:  # batch-norm statistics averaged, so every rank holds the same model; rank 0 goes on
        dist.allreduce_([t for t in opt.buffers if dtypes.is_float(t.dtype)], op="mean")
        if rank != 0:
            return float("nan")
    # evaluate in fixed-size batches (the jitted predict needs one shape); the tail batch runs eagerly
    n_test, bs, correct = as_int(X_test.shape[0]), 500, 0
    for i in range(0, n_test, bs):
        xb = X_test[i : i + bs].contiguous()
        if xb.shape[0] == bs:
            pred = predict(place(xb))  # lazy: the jit gives it a buffer of its own (a realized slice is a view)
        else:  # the tail batch, eagerly (replicated when there are several devices: it may not split evenly)
            pred = model((xb.to(devices) if len(devices) > 1 else xb).float() * (1 / 255.0) - 0.5).argmax(axis=1)
        correct += int((pred.numpy() == Y_test[i : i + bs].numpy()).sum())
    acc_test = correct / n_test
    on = f" on {len(devices)} devices ({', '.join(devices)})" if len(devices) > 1 else ""
    on += f" over {ranks} MPI ranks" if ranks > 1 else ""
    print(f"test accuracy {acc_test * 100:.2f}% on {n_test} images; trained {args.steps} steps of {args.batch}{on} in "
          f"{train_s:.1f} s ({images / train_s:.0f} images/s)")  # fmt: skip
    if losses:
        print(f"train loss {losses[0][1]:.4f} at step {losses[0][0]}, {losses[-1][1]:.4f} at step {losses[-1][0]}")
    if args.out:
        safe_save({k: v.cast(dtypes.float32) if v.dtype != dtypes.int32 else v for k, v in
                   get_state_dict(model).items()}, args.out, {"model": "fashion-mnist cnn"})  # fmt: skip
        print(f"saved weights to {args.out}")
    return acc_test


def _train_loop(args: Any, bar: Any, opt: Any, train_step: Any, rng: Any, n_train: int, rank: int, ranks: int,
                t_start: float) -> list[tuple[int, float]]:  # fmt: skip
    """The training steps: each draws a batch of indices (the same on every rank; a rank keeps its share). Returns
    (step, loss) of the steps whose loss was read (every 10th and the last, on rank 0)."""
    share = args.batch // ranks
    images = 0
    losses: list[tuple[int, float]] = []
    for step in bar:
        if args.schedule == "cosine":  # the lr tensor is a kernel input, so the jitted step sees every new value
            opt.lr.assign(Tensor([args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))], dtype=dtypes.float32))
        idx = rng.integers(0, n_train, args.batch).astype(np.int32)[rank * share : (rank + 1) * share]
        loss, acc = train_step(Tensor(idx))
        images += args.batch
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            elapsed = time.perf_counter() - t_start
            losses.append((step, loss.item()))
            bar.set_postfix(loss=f"{losses[-1][1]:.3f}", acc=f"{acc.item():.3f}", img_s=f"{images / elapsed:.0f}")
    return losses


def parse_devices(spec: str) -> tuple[str, ...]:
    """--devices: a count N (CPU:0..N-1) or a comma-separated list of device names."""
    if spec.strip().isdigit():
        n = int(spec)
        if n < 1:
            raise SystemExit(f"--devices must be at least 1, got {n}")
        return tuple(Device.canonicalize(f"CPU:{i}") for i in range(n))
    return tuple(Device.canonicalize(d.strip()) for d in spec.split(",") if d.strip())


def cli() -> None:
    """The `speck-train` command: main() without its return value (a console script's return value is its exit
    status, so returning the accuracy would exit with status 1)."""
    main()


if __name__ == "__main__":
    cli()
