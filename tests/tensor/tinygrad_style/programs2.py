"""A tinygrad-style unittest module (run through the alias by tests/tensor/test_parity_import_surface.py): whole
training programs as tinygrad's examples write them - beautiful_mnist's loop (trange, colored, getenv, a jitted step
with Tensor.randint batches, GlobalCounters, a jitted accuracy) with each of tinygrad's optimizers and a user's
learning-rate schedule assigned into opt.lr, and a checkpoint taken mid-training (get_state_dict of the model and
the optimizer, safe_save/safe_load, load_state_dict strict=False) that resumes to the same losses bit for bit. The
numpy float64 references of these programs are tests/integration/test_programs2.py; here they are checked against
the same program run without the jit, and against closed forms."""

import math
import tempfile
import unittest

import numpy as np
from tinygrad import GlobalCounters, Tensor, TinyJit, nn
from tinygrad.helpers import colored, getenv, trange
from tinygrad.nn.optim import LAMB, LARS, SGD, AdamW
from tinygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


class Model:
    def __init__(self):
        self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
                       lambda x: x.flatten(1), nn.Linear(4 * 3 * 3, 4)]  # fmt: skip

    def __call__(self, x):
        return x.sequential(self.layers)


def data():
    rng = np.random.default_rng(0)
    X = (rng.random((40, 1, 8, 8)) * 255).astype(np.uint8)
    Y = (X.reshape(40, -1).mean(1) > 127).astype(np.int32) + 2 * (X[:, 0, 0, 0] > 127)  # learnable labels
    return Tensor(X), Tensor(Y)


def train(make_opt, steps, jit=True, seed=0):
    Tensor.manual_seed(seed)
    X_train, Y_train = data()
    model = Model()
    opt = make_opt(get_parameters(model))
    lr0 = opt.lr.item()

    def train_step():
        with Tensor.train():
            opt.zero_grad()
            samples = Tensor.randint(getenv("BS", 8), high=X_train.shape[0])
            loss = model(X_train[samples].float() / 255.0).sparse_categorical_crossentropy(Y_train[samples])
            loss.backward()
            opt.step()
            return loss

    def get_test_acc():
        return (model(X_train.float() / 255.0).argmax(axis=1) == Y_train).mean() * 100

    if jit:
        train_step, get_test_acc = TinyJit(train_step), TinyJit(get_test_acc)
    losses, kernels = [], []
    for i in (t := trange(steps, disable=not getenv("PROGRESS"))):  # (the bar writes to stderr: unittest's stream)
        opt.lr.assign(Tensor([lr0 * 0.5 * (1 + math.cos(math.pi * i / steps))], dtype=opt.lr.dtype))
        GlobalCounters.reset()
        loss = train_step().item()
        losses.append(loss)
        kernels.append(GlobalCounters.kernel_count)
        t.set_description(f"loss: {loss:6.2f} kernels: {GlobalCounters.kernel_count}")
    acc = get_test_acc().item()
    print(colored(f"test_accuracy: {acc:5.2f}%", "green"))
    return losses, kernels, acc, model, opt


OPTS = {
    "sgd_nesterov": lambda p: SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adamw": lambda p: AdamW(p, lr=3e-3, weight_decay=0.01),
    "lamb": lambda p: LAMB(p, lr=3e-3, weight_decay=0.01),
    "lars": lambda p: LARS(p, lr=0.5, momentum=0.9, weight_decay=1e-4),
}


class TestBeautifulMnist(unittest.TestCase):
    def test_each_optimizer_jitted_equals_unjitted(self):
        for name, make in OPTS.items():
            with self.subTest(name):
                jl, jk, jacc, _, _ = train(make, 8, jit=True)
                el, _, eacc, _, _ = train(make, 8, jit=False)
                np.testing.assert_allclose(jl, el, rtol=1e-5, atol=1e-6)
                self.assertEqual(jacc, eacc)
                self.assertTrue(all(k > 0 for k in jk) and len(set(jk[2:])) == 1, jk)  # replays: the same kernels
                self.assertTrue(0 <= jacc <= 100 and abs(jacc * 0.4 - round(jacc * 0.4)) < 1e-3, jacc)  # k/40

    def test_lr_schedule_reaches_the_optimizer(self):
        _, _, _, _, opt = train(OPTS["sgd_nesterov"], 4)
        self.assertAlmostEqual(opt.lr.item(), 0.05 * 0.5 * (1 + math.cos(math.pi * 3 / 4)), places=6)
        # lr 0 freezes the parameters: the schedule is read by the jitted step, not folded into it
        Tensor.manual_seed(0)
        X, Y = data()
        model = Model()
        opt = SGD(get_parameters(model), lr=0.1)

        @TinyJit
        @Tensor.train()
        def step():
            opt.zero_grad()
            loss = model(X[:8].float() / 255.0).sparse_categorical_crossentropy(Y[:8]).backward()
            opt.step()
            return loss

        for _ in range(3):
            step()
        opt.lr.assign(Tensor([0.0], dtype=opt.lr.dtype)).realize()
        before = [p.numpy().copy() for p in opt.params]  # (BatchNorm's statistics still move: buffers)
        step()
        after = [p.numpy() for p in opt.params]
        for b, a in zip(before, after):
            np.testing.assert_array_equal(a, b)


class TestResume(unittest.TestCase):
    def test_checkpoint_mid_training_resumes_bit_for_bit(self):
        X, Y = data()
        batches = [np.arange(i * 8, i * 8 + 8) % 40 for i in range(6)]

        def run(split_at, path):
            Tensor.manual_seed(4)
            model = Model()
            opt = LAMB(get_parameters(model), lr=0.01)

            def make_step(model, opt):
                @TinyJit
                @Tensor.train()
                def step(idx):
                    opt.zero_grad()
                    loss = model(X[idx].float() / 255.0).sparse_categorical_crossentropy(Y[idx]).backward()
                    opt.step()
                    return loss

                return step

            step, losses = make_step(model, opt), []
            for i, b in enumerate(batches):
                if i == split_at:
                    safe_save({**{f"model.{k}": v for k, v in get_state_dict(model).items()},
                               **{f"optim.{k}": v for k, v in get_state_dict(opt).items()}}, path)  # fmt: skip
                    Tensor.manual_seed(99)  # a different initialisation, all of it overwritten by the checkpoint
                    model = Model()
                    opt = LAMB(get_parameters(model), lr=0.01)
                    sd = safe_load(path)
                    missing = {k[6:]: v for k, v in sd.items() if k.startswith("model.")}
                    missing.pop("layers.5.bias")  # strict=False: a key the file lacks keeps the model's value...
                    load_state_dict(model, missing, strict=False, verbose=False)
                    model.layers[5].bias.assign(sd["model.layers.5.bias"].to(model.layers[5].bias.device)).realize()
                    load_state_dict(opt, {k[6:]: v for k, v in sd.items() if k.startswith("optim.")}, verbose=False)
                    step = make_step(model, opt)
                losses.append(step(Tensor(b.astype(np.int32))).item())
            return losses, [v.numpy() for v in get_state_dict(model).values()]

        with tempfile.TemporaryDirectory() as d:
            straight, s_state = run(-1, f"{d}/a.safetensors")
            resumed, r_state = run(3, f"{d}/b.safetensors")
        self.assertEqual(straight, resumed)
        for a, b in zip(s_state, r_state):
            np.testing.assert_array_equal(a, b)


if __name__ == "__main__":
    unittest.main()
