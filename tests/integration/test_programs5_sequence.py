"""Model programs (fifth set, with test_programs5.py) whose losses are themselves little programs, written the way
tinygrad users write them: CTC loss by the forward algorithm in log space (shifted alphas by pad, logsumexp, per-
sequence input and target lengths) trained under TinyJit; a two-layer graph attention network with an adjacency-masked
softmax; a PixelCNN with type A/B masked convolutions, its autoregressive property checked through input gradients,
and pixel-by-pixel sampling under TinyJit; REINFORCE with actions drawn by multinomial from a fixed seed and
discounted returns by flip and cumsum. Each is checked against a numpy float64 re-implementation."""

from __future__ import annotations

import itertools
import math

import numpy as np
from gradcheck import F64, P, check_grads, init, np_adam, num_grad, rng

from speck.tensor import Tensor, TinyJit, dtypes, nn
from speck.tensor.nn.optim import SGD, Adam
from speck.tensor.nn.state import get_parameters, get_state_dict

NEG = -1e30  # "log 0" for the Tensor code: -inf would make logsumexp's max-subtraction give nan


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ---------------- CTC: the forward algorithm in log space with Tensor ops ----------------
def ctc_loss(logp: Tensor, targets: np.ndarray, in_lens: np.ndarray, tgt_lens: np.ndarray, blank: int = 0) -> Tensor:
    """Mean over the batch of -log p(target | input); logp (T, B, C) log-probabilities. The extended label sequence
    puts a blank around every target symbol; the skip from s-2 is allowed onto a symbol that differs from s-2."""
    t_max, b, _ = logp.shape
    s_max = targets.shape[1]
    ext = np.full((b, 2 * s_max + 1), blank)
    ext[:, 1::2] = targets
    skip = np.zeros(ext.shape, bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    emit = logp.gather(2, Tensor(np.broadcast_to(ext, (t_max, *ext.shape)).astype(np.int32)))  # (T, B, L)
    skip_t, width = Tensor(skip), ext.shape[1]
    start = np.full(ext.shape, NEG, np.float32)
    start[:, :2] = 0.0
    alpha = emit[0] + Tensor(start)
    for t in range(1, t_max):
        a1 = alpha.pad(((0, 0), (1, 0)), value=NEG).shrink((None, (0, width)))
        a2 = alpha.pad(((0, 0), (2, 0)), value=NEG).shrink((None, (0, width)))
        a2 = skip_t.where(a2, NEG)
        new = Tensor.stack(alpha, a1, a2).logsumexp(0) + emit[t]
        alpha = Tensor(t < in_lens).reshape(b, 1).where(new, alpha)  # a finished input keeps its last alphas
    ends = np.stack([2 * tgt_lens, 2 * tgt_lens - 1], 1)  # the last blank and the last symbol
    return -alpha.gather(1, Tensor(ends.astype(np.int32))).logsumexp(1).mean()


def np_ctc_one(lp: np.ndarray, target: list[int], blank: int = 0) -> float:
    """-log p for one sequence (lp (T, C)), with np.logaddexp (-inf is fine here)."""
    ext = [blank]
    for c in target:
        ext += [c, blank]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = lp[0, blank]
    if len(ext) > 1:
        alpha[1] = lp[0, ext[1]]
    e = np.array(ext)
    skip = np.zeros(len(e), bool)
    skip[2:] = (e[2:] != blank) & (e[2:] != e[:-2])
    for t in range(1, len(lp)):
        a1 = np.concatenate([[-np.inf], alpha[:-1]])
        a2 = np.where(skip, np.concatenate([[-np.inf, -np.inf], alpha[:-2]]), -np.inf)
        alpha = np.logaddexp(np.logaddexp(alpha, a1), a2) + lp[t, e]
    return float(-np.logaddexp(alpha[-1], alpha[-2]) if len(ext) > 1 else -alpha[-1])


def np_ctc_brute(lp: np.ndarray, target: list[int], blank: int = 0) -> float:
    """-log of the summed probability of every path that collapses to target (merge repeats, drop blanks)."""
    total = 0.0
    for path in itertools.product(range(lp.shape[1]), repeat=len(lp)):
        collapsed = [c for i, c in enumerate(path) if c != blank and (i == 0 or c != path[i - 1])]
        if collapsed == target:
            total += math.exp(sum(lp[t, c] for t, c in enumerate(path)))
    return -math.log(total)


class CTCModel:
    def __init__(self, n_in: int, n_hid: int, classes: int) -> None:
        self.conv = nn.Conv1d(n_in, n_hid, 3, padding=1)
        self.out = nn.Linear(n_hid, classes)

    def __call__(self, x: Tensor) -> Tensor:  # x (B, F, T) -> log-probabilities (T, B, C)
        return self.out(self.conv(x).relu().permute(2, 0, 1)).log_softmax(-1)


def np_ctc_model(p: P, x: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    t = x.shape[2]
    h = sum(np.einsum("oc,bct->bot", p["conv.weight"][:, :, j], xp[:, :, j : j + t]) for j in range(3))
    h = np.maximum(h + p["conv.bias"][None, :, None], 0).transpose(2, 0, 1)
    return np_log_softmax(h @ p["out.weight"].T + p["out.bias"])


def test_ctc_forward_algorithm_matches_numpy_and_trains_under_tinyjit() -> None:
    # the numpy reference itself, against brute force over every path of a short input
    lp = np_log_softmax(rng(90).standard_normal((4, 3)))
    for target in ([1], [1, 2], [1, 1], [2, 1, 2]):
        assert math.isclose(np_ctc_one(lp, target), np_ctc_brute(lp, target), rel_tol=1e-9), target

    n_in, n_hid, classes, t = 3, 6, 4, 9
    model = CTCModel(n_in, n_hid, classes)
    p = init(model, seed=91, scale=0.5)
    params = get_state_dict(model)
    r = rng(92)
    x = r.standard_normal((3, n_in, t))
    targets = np.array([[1, 2, 2], [3, 1, 0], [2, 0, 0]])  # padded with 0 past each length
    tgt_lens, in_lens = np.array([3, 2, 1]), np.array([9, 7, 5])
    xt = Tensor(x.astype(np.float32))

    def np_loss() -> float:
        lpn = np_ctc_model(p, x)
        return float(np.mean([np_ctc_one(lpn[: in_lens[i], i], list(targets[i, : tgt_lens[i]])) for i in range(3)]))

    loss = ctc_loss(model(xt), targets, in_lens, tgt_lens)
    np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-5)
    with Tensor.train():
        ctc_loss(model(xt), targets, in_lens, tgt_lens).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    opt = Adam(get_parameters(model), lr=0.05)
    opt.zero_grad()

    @TinyJit
    def step(xb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = ctc_loss(model(xb), targets, in_lens, tgt_lens).backward()
            opt.step()
        return loss.realize()

    ad: dict = {}
    losses = []
    for i in range(1, 6):
        g = grads if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step(xt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.05)
    assert losses[-1] < losses[0] - 0.1
    # greedy decoding of the trained model: argmax per frame, repeats merged, blanks dropped; numpy agrees
    frames = model(xt).argmax(-1).numpy().T
    np.testing.assert_array_equal(frames, np_ctc_model(p, x).argmax(-1).T)


# ---------------- graph attention network: adjacency-masked attention over neighbours, two layers ----------------
class GATLayer:
    def __init__(self, n_in: int, n_out: int, heads: int) -> None:
        self.w = nn.Linear(n_in, n_out * heads, bias=False)
        self.a_src, self.a_dst = Tensor.zeros(heads, n_out), Tensor.zeros(heads, n_out)
        self.heads, self.n_out = heads, n_out

    def __call__(self, x: Tensor, adj: Tensor) -> Tensor:  # x (N, F), adj (N, N) bool -> (N, heads, n_out)
        h = self.w(x).reshape(x.shape[0], self.heads, self.n_out)
        e_src, e_dst = (h * self.a_src).sum(-1), (h * self.a_dst).sum(-1)  # (N, heads)
        e = (e_dst.unsqueeze(1) + e_src.unsqueeze(0)).leaky_relu(0.2)  # (i, j, heads): i attends to j
        att = adj.unsqueeze(-1).where(e, -math.inf).softmax(1)
        return (att.permute(2, 0, 1) @ h.permute(1, 0, 2)).permute(1, 0, 2)


class GAT:
    def __init__(self, n_in: int, n_hid: int, heads: int, classes: int) -> None:
        self.l1, self.l2 = GATLayer(n_in, n_hid, heads), GATLayer(n_hid * heads, classes, 1)

    def __call__(self, x: Tensor, adj: Tensor) -> Tensor:
        h = self.l1(x, adj).flatten(1).elu()
        return self.l2(h, adj).squeeze(1)


def np_gat_layer(p: P, pre: str, x: np.ndarray, adj: np.ndarray, heads: int) -> np.ndarray:
    h = (x @ p[f"{pre}.w.weight"].T).reshape(x.shape[0], heads, -1)
    e_src, e_dst = (h * p[f"{pre}.a_src"]).sum(-1), (h * p[f"{pre}.a_dst"]).sum(-1)
    e = e_dst[:, None] + e_src[None]
    e = np.where(e > 0, e, 0.2 * e)
    e = np.where(adj[..., None], e, -np.inf)
    att = np.exp(e - e.max(1, keepdims=True))
    att = att / att.sum(1, keepdims=True)
    return np.einsum("ijh,jhd->ihd", att, h)


def np_gat(p: P, x: np.ndarray, adj: np.ndarray, heads: int) -> np.ndarray:
    h = np_gat_layer(p, "l1", x, adj, heads).reshape(x.shape[0], -1)
    h = np.where(h > 0, h, np.exp(h) - 1)
    return np_gat_layer(p, "l2", h, adj, 1)[:, 0]


def test_graph_attention_network_node_classification_matches_numpy() -> None:
    n, f, hid, heads, classes = 7, 4, 3, 2, 3
    model = GAT(f, hid, heads, classes)
    p = init(model, seed=101, scale=0.6)
    params = get_state_dict(model)
    r = rng(102)
    edges = [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (1, 4)]
    adj = np.eye(n, dtype=bool)  # self-loops: every row has a neighbour (a row of -inf only would be nan)
    for a, b in edges:
        adj[a, b] = adj[b, a] = True
    x, y = r.standard_normal((n, f)), r.integers(0, classes, n)
    train_idx = np.array([0, 2, 4, 5])  # semi-supervised: the loss sees only these nodes
    xt, at = Tensor(x.astype(np.float32)), Tensor(adj)
    ti, yt = Tensor(train_idx.astype(np.int32)), Tensor(y[train_idx].astype(np.int32))
    np.testing.assert_allclose(model(xt, at).numpy(), np_gat(p, x, adj, heads), rtol=1e-4, atol=1e-5)
    # a node's output depends only on nodes within two hops (6 is 3 hops from 0)
    x2 = x.copy()
    x2[6] += 3.0
    np.testing.assert_allclose(model(Tensor(x2.astype(np.float32)), at).numpy()[0], model(xt, at).numpy()[0])

    def np_loss() -> float:
        lp = np_log_softmax(np_gat(p, x, adj, heads))[train_idx]
        return float(-lp[np.arange(len(train_idx)), y[train_idx]].mean())

    opt = Adam(get_parameters(model), lr=0.02)

    @TinyJit
    def step(xb: Tensor, ab: Tensor, idx: Tensor, yb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb, ab)[idx].sparse_categorical_crossentropy(yb).backward()
            opt.step()
        return loss.realize()

    with Tensor.train():
        model(xt, at)[ti].sparse_categorical_crossentropy(yt).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    opt.zero_grad()
    ad: dict = {}
    losses = []
    for i in range(1, 6):
        g = grads if i == 1 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step(xt, at, ti, yt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        np_adam(p, g, ad, i, lr=0.02)
    for k, t in params.items():
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-3, atol=1e-4, err_msg=k)
    assert losses[-1] < losses[0]


# ---------------- PixelCNN: masked convolutions, the autoregressive property, sampling under TinyJit ----------------
def conv_mask(k: int, cin: int, cout: int, kind: str) -> np.ndarray:
    """1 above the centre row and left of the centre in its row; the centre itself only for type B."""
    m = np.zeros((cout, cin, k, k), np.float32)
    c = k // 2
    m[:, :, :c] = 1
    m[:, :, c, : c + (kind == "B")] = 1
    return m


class PixelCNN:
    def __init__(self, ch: int) -> None:
        self.c1, self.c2 = nn.Conv2d(1, ch, 3, padding=1), nn.Conv2d(ch, ch, 3, padding=1)
        self.out = nn.Conv2d(ch, 1, 1)
        self.np_masks = (conv_mask(3, 1, ch, "A"), conv_mask(3, ch, ch, "B"))  # numpy: not in the state dict

    def __call__(self, x: Tensor) -> Tensor:  # logits of each pixel being 1, given the pixels before it
        ma, mb = (Tensor(m) for m in self.np_masks)
        h = x.conv2d(self.c1.weight * ma, self.c1.bias, padding=1).relu()
        h = h.conv2d(self.c2.weight * mb, self.c2.bias, padding=1).relu()
        return self.out(h)


def np_conv3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    hh, ww = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = sum(
        np.einsum("nchw,oc->nohw", xp[:, :, i : i + hh, j : j + ww], w[:, :, i, j]) for i in range(3) for j in range(3)
    )
    return out + b[None, :, None, None]


def np_pixelcnn(p: P, x: np.ndarray, masks: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    h = np.maximum(np_conv3(x, p["c1.weight"] * masks[0], p["c1.bias"]), 0)
    h = np.maximum(np_conv3(h, p["c2.weight"] * masks[1], p["c2.bias"]), 0)
    return np.einsum("nchw,oc->nohw", h, p["out.weight"][:, :, 0, 0]) + p["out.bias"][None, :, None, None]


def test_pixelcnn_masked_convs_are_autoregressive_train_and_sample_like_numpy() -> None:
    ch, side = 4, 4
    model = PixelCNN(ch)
    p = init(model, seed=111, scale=0.5)
    params = get_state_dict(model)
    assert set(params) == {"c1.weight", "c1.bias", "c2.weight", "c2.bias", "out.weight", "out.bias"}
    masks = model.np_masks
    r = rng(112)
    imgs = (r.uniform(size=(6, 1, side, side)) < np.linspace(0.2, 0.8, side)[None, None, None]).astype(F64)
    xt = Tensor(imgs.astype(np.float32))
    np.testing.assert_allclose(model(xt).numpy(), np_pixelcnn(p, imgs, masks), rtol=1e-4, atol=1e-5)
    # autoregressive: the logit at pixel (i, j) has zero gradient w.r.t. that pixel and every later one
    x1 = Tensor(imgs[:1].astype(np.float32))
    for i, j in ((0, 0), (1, 2), (3, 3)):
        (g,) = model(x1)[0, 0, i, j].gradient(x1)
        g = np.abs(g.numpy()[0, 0]).reshape(-1)
        assert np.all(g[i * side + j :] == 0), (i, j)
        assert (i, j) == (0, 0) or np.any(g[: i * side + j] > 0)

    def np_loss() -> float:
        z = np_pixelcnn(p, imgs, masks)
        return float((np.maximum(z, 0) - z * imgs + np.log1p(np.exp(-np.abs(z)))).mean())

    opt = SGD(get_parameters(model), lr=0.5)

    @TinyJit
    def step(xb: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(xb).binary_crossentropy_logits(xb).backward()
            opt.step()
        return loss.realize()

    with Tensor.train():
        model(xt).binary_crossentropy_logits(xt).backward()
    grads = {k: num_grad(np_loss, p[k]) for k in p}
    check_grads(params, grads)
    opt.zero_grad()
    losses = []
    for i in range(4):
        g = grads if i == 0 else {k: num_grad(np_loss, p[k]) for k in p}
        want = np_loss()
        losses.append(step(xt).item())
        np.testing.assert_allclose(losses[-1], want, rtol=1e-4, err_msg=f"step {i}")
        for k in p:
            p[k] = p[k] - 0.5 * g[k]
    assert losses[-1] < losses[0]

    # sampling pixel by pixel from seeded uniforms, the whole image through the jitted net each time
    @TinyJit
    def probs(img: Tensor) -> Tensor:
        return model(img).sigmoid().realize()

    Tensor.manual_seed(5)
    u = Tensor.rand(2, side, side).numpy().astype(F64)
    img, want = np.zeros((2, 1, side, side), np.float32), np.zeros((2, 1, side, side))
    for i in range(side):
        for j in range(side):
            pr = probs(Tensor(img)).numpy()[:, 0, i, j]
            img[:, 0, i, j] = u[:, i, j] < pr
            pw = 1 / (1 + np.exp(-np_pixelcnn(p, want, masks)[:, 0, i, j]))
            want[:, 0, i, j] = u[:, i, j] < pw
            np.testing.assert_allclose(pr, pw, rtol=1e-4, atol=1e-5, err_msg=f"pixel {i, j}")
    np.testing.assert_array_equal(img, want)
    assert probs.cnt == side * side


# ---------------- REINFORCE: multinomial actions from a fixed seed, discounted returns by flip and cumsum ----------
def test_reinforce_with_seeded_multinomial_actions_and_discounted_returns() -> None:
    n_s, n_a, steps, gamma = 3, 3, 6, 0.9
    policy = nn.Linear(n_s, n_a)
    p = init(policy, seed=121, scale=0.5)
    r = rng(122)
    states = r.standard_normal((steps, n_s))
    payoff = r.standard_normal((steps, n_a))  # the reward of each action at each step
    st, pt = Tensor(states.astype(np.float32)), Tensor(payoff.astype(np.float32))
    disc = gamma ** np.arange(steps)
    dt = Tensor(disc.astype(np.float32))
    opt = SGD(get_parameters(policy), lr=0.1)

    @TinyJit
    def episode(s: Tensor, pay: Tensor) -> tuple[Tensor, Tensor]:
        with Tensor.train():
            opt.zero_grad()
            probs = policy(s).softmax(-1)
            acts = probs.detach().multinomial()  # (steps, 1), one draw per row from the RNG's stream
            rew = pay.gather(1, acts).squeeze(1)
            ret = (rew * dt).flip(0).cumsum(0).flip(0) / dt  # G_t = sum_k gamma^(k-t) r_k
            adv = ret - ret.mean()
            logp = probs.log().gather(1, acts).squeeze(1)
            loss = -(logp * adv.detach()).mean()
            loss.backward()
            opt.step()
        return acts.realize(), loss.realize()

    Tensor.manual_seed(3)
    run1 = []
    for _ in range(5):
        acts, loss = episode(st, pt)
        a = acts.numpy()[:, 0]
        rew = payoff[np.arange(steps), a]
        ret = np.array([sum(gamma ** (k - t) * rew[k] for k in range(t, steps)) for t in range(steps)])
        adv = ret - ret.mean()

        def np_loss(a: np.ndarray = a, adv: np.ndarray = adv) -> float:
            lp = np_log_softmax(states @ p["weight"].T + p["bias"])
            return float(-(lp[np.arange(steps), a] * adv).mean())

        np.testing.assert_allclose(loss.item(), np_loss(), rtol=1e-4, atol=1e-6)
        g = {k: num_grad(np_loss, p[k]) for k in p}
        for k in p:
            p[k] = p[k] - 0.1 * g[k]
        run1.append(a)
    for k, t in get_state_dict(policy).items():
        np.testing.assert_allclose(t.numpy(), p[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert len({tuple(a) for a in run1}) > 1  # the draws advance between replays

    # the same seed replays the same draws (a fresh policy with the same start, the same jitted program)
    policy2 = nn.Linear(n_s, n_a)
    init(policy2, seed=121, scale=0.5)
    opt2 = SGD(get_parameters(policy2), lr=0.1)

    @TinyJit
    def episode2(s: Tensor) -> Tensor:
        with Tensor.train():
            opt2.zero_grad()
            probs = policy2(s).softmax(-1)
            acts = probs.detach().multinomial()
            rew = pt.gather(1, acts).squeeze(1)
            ret = (rew * dt).flip(0).cumsum(0).flip(0) / dt
            (-(probs.log().gather(1, acts).squeeze(1) * (ret - ret.mean()).detach()).mean()).backward()
            opt2.step()
        return acts.realize()

    Tensor.manual_seed(3)
    run2 = [episode2(st).numpy()[:, 0] for _ in range(5)]
    np.testing.assert_array_equal(np.stack(run2), np.stack(run1))

    # the draws follow the policy: frequencies of many draws from one distribution
    Tensor.manual_seed(9)
    pr = np.array([0.2, 0.5, 0.3])
    draws = Tensor(pr.astype(np.float32)).reshape(1, 3).multinomial(4000, replacement=True).numpy()[0]
    freq = np.bincount(draws, minlength=3) / 4000
    np.testing.assert_allclose(freq, pr, atol=0.03)
    assert dtypes.is_int(Tensor([[0.5, 0.5]]).multinomial().dtype)
