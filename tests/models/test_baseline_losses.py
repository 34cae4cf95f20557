"""The gradient-trained baselines' losses against values computed by hand (numpy, float64) on tiny
cases with every weight set, and the pieces their fold-in rests on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models import bpr as bpr_module
from models import cdae as cdae_module
from models import cml as cml_module
from models import peruser
from models.batch import Batch
from models.bpr import BPR, pair_losses
from models.cdae import CDAE
from models.cml import CML, clip
from models.peruser import hashed_negatives, is_positive, row_hash
from models.vae import VAECF, KLSchedule


def batch(users, rows) -> Batch:
    items = torch.tensor([i for r in rows for i in r], dtype=torch.int64)
    offsets = torch.tensor(np.cumsum([0] + [len(r) for r in rows[:-1]]), dtype=torch.int64)
    empty = torch.zeros(0, dtype=torch.int64)
    return Batch(users=torch.tensor(users), train_items=items, train_offsets=offsets,
                 train_rstar=torch.zeros(0), neg_items=empty, neg_counts=empty,
                 neg_offsets=torch.zeros(len(rows), dtype=torch.int64))


def fixed_negatives(monkeypatch, module, neg):
    monkeypatch.setattr(module, "uniform_negatives",
                        lambda nnz, c, n, device: torch.tensor(neg, dtype=torch.int64))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_bpr_loss_by_hand(monkeypatch):
    m = BPR(n_items=4, n_users=2, width=2, lam=0.1, neg_ratio=1)
    U = np.array([[1.0, 0.5], [-0.5, 2.0]])
    V = np.array([[0.2, 0.1], [1.0, -1.0], [0.0, 0.3], [0.5, 0.5]])
    m.users.weight.data = torch.tensor(U, dtype=torch.float32)
    m.items.weight.data = torch.tensor(V, dtype=torch.float32)
    # user 1 likes items 0 and 2; user 0 likes item 1. Draws: 3 for (1,0); 2 for (1,2), a
    # positive of user 1, so that triple is dropped; 0 for (0,1)
    fixed_negatives(monkeypatch, bpr_module, [[3], [2], [0]])
    terms = m(batch([1, 0], [[0, 2], [1]]))
    triples = [(1, 0, 3), (0, 1, 0)]
    want = np.mean([-np.log(sigmoid(U[u] @ V[i] - U[u] @ V[j])) for u, i, j in triples])
    l2 = 0.1 * np.mean([U[u] @ U[u] + V[i] @ V[i] + V[j] @ V[j] for u, i, j in triples])
    assert float(terms["bpr"]) == pytest.approx(want, rel=1e-6)
    assert float(terms["l2"]) == pytest.approx(l2, rel=1e-6)


def test_cml_loss_by_hand(monkeypatch):
    m = CML(n_items=4, n_users=1, width=2, margin=0.5, neg_ratio=2, cov_weight=0.3)
    U = np.array([[0.3, 0.4]])
    V = np.array([[0.2, 0.1], [3.0, 4.0], [0.0, 0.3], [0.5, 0.5]])  # item 1 lies outside the ball
    m.users.weight.data = torch.tensor(U, dtype=torch.float32)
    m.items.weight.data = torch.tensor(V, dtype=torch.float32)
    fixed_negatives(monkeypatch, cml_module, [[1, 3], [2, 3]])  # user 0 likes 0 and 2: 2 dropped
    terms = m(batch([0], [[0, 2]]))
    Vc = V / np.maximum(1, np.linalg.norm(V, axis=1, keepdims=True))
    d = lambda i: np.sum((U[0] - Vc[i]) ** 2)  # noqa: E731
    want = []
    for pos, draws in ((0, [1, 3]), (2, [3])):
        impostors = sum(0.5 + d(pos) - d(k) > 0 for k in draws)
        w = math.log(1 + math.floor(4 * impostors / 2))
        want.append(w * max(0.0, 0.5 + d(pos) - min(d(k) for k in draws)))
    assert float(terms["hinge"]) == pytest.approx(np.mean(want), rel=1e-5)
    x = np.concatenate([U, Vc])  # the batch's user and every item it touched (0..3)
    c = np.cov(x.T, bias=True)
    assert float(terms["cov"]) == pytest.approx(0.3 * ((c ** 2).sum() - (np.diag(c) ** 2).sum())
                                                / len(x), rel=1e-5)


def test_cdae_loss_by_hand(monkeypatch):
    m = CDAE(n_items=3, n_users=2, width=2, lam=0.2, dropout=0.5, neg_ratio=1).eval()  # no corruption
    W = np.array([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]])       # encoder rows, one per item
    Vu = np.array([[0.0, 0.0], [0.2, -0.1]])
    Wd, bd, be = np.array([[0.5, -0.5], [1.0, 0.2], [-0.3, 0.7]]), np.array([0.1, 0.0, -0.2]), \
        np.array([0.05, -0.05])
    m.encoder.weight.data = torch.tensor(W, dtype=torch.float32)
    m.users.weight.data = torch.tensor(Vu, dtype=torch.float32)
    m.decoder.weight.data = torch.tensor(Wd, dtype=torch.float32)
    m.decoder.bias.data = torch.tensor(bd, dtype=torch.float32)
    m.encoder_bias.data = torch.tensor(be, dtype=torch.float32)
    fixed_negatives(monkeypatch, cdae_module, [[2], [1]])  # user 1 likes 0 and 1: draw 1 dropped
    terms = m(batch([1], [[0, 1]]))
    z = sigmoid(W[0] + W[1] + Vu[1] + be)
    y = sigmoid(Wd @ z + bd)
    want = (-np.log(y[0]) - np.log(y[1]) - np.log(1 - y[2])) / 3
    assert float(terms["log_loss"]) == pytest.approx(want, rel=1e-5)
    l2 = 0.2 * ((W ** 2).mean() + (Wd ** 2).mean() + (Vu[1] ** 2).mean())
    assert float(terms["l2"]) == pytest.approx(l2, rel=1e-5)
    m.neg_ratio = 0  # the whole row: every item's log loss, positives 0 and 1
    whole = m(batch([1], [[0, 1]]))["log_loss"]
    assert float(whole) == pytest.approx(want, rel=1e-5)  # 3 items: the same three entries


def test_vae_loss_by_hand():
    m = VAECF(n_items=3, width=1, hidden=2, dropout=0.5, kl_cap=0.2, anneal_steps=10, lam=0.0)
    schedule = KLSchedule(0.2, 10, updates=4)  # beta_t = min(0.2, 4 / 10)
    m.eval()           # the mean code, no dropout
    E = np.array([[0.1, 0.2], [-0.3, 0.4], [0.5, -0.6]])
    eb = np.array([0.01, -0.02])
    Wo, bo = np.array([[0.3, -0.1], [0.2, 0.5]]), np.array([0.05, -0.4])
    W3, b3 = np.array([[0.7], [-0.2]]), np.array([0.1, 0.0])
    W4, b4 = np.array([[0.4, 0.1], [-0.6, 0.3], [0.2, 0.2]]), np.array([0.0, 0.1, -0.1])
    for p, v in ((m.encoder_in.weight, E), (m.encoder_bias, eb), (m.encoder_out.weight, Wo),
                 (m.encoder_out.bias, bo), (m.decoder[0].weight, W3), (m.decoder[0].bias, b3),
                 (m.decoder[2].weight, W4), (m.decoder[2].bias, b4)):
        p.data = torch.tensor(v, dtype=torch.float32)
    terms = m(batch([0], [[0, 2]]), schedule)
    x = np.array([1.0, 0.0, 1.0])
    h = np.tanh(E.T @ (x / np.sqrt(2)) + eb)
    mu, logvar = Wo @ h + bo
    logits = W4 @ np.tanh(W3[:, 0] * mu + b3) + b4
    logp = logits - np.log(np.exp(logits).sum())
    assert float(terms["nll"]) == pytest.approx(-(logp * x).sum(), rel=1e-5)
    kl = 0.5 * (np.exp(logvar) + mu ** 2 - 1 - logvar)
    assert float(terms["kl"]) == pytest.approx(0.2 * kl, rel=1e-5)
    assert schedule.updates == 4  # only a training forward advances the schedule
    torch.testing.assert_close(m.score(batch([0], [[0, 2]]).train_items, torch.tensor([0])),
                               torch.tensor([logits], dtype=torch.float32))


def test_vae_kl_weight_rises_linearly_to_its_cap():
    m = VAECF(n_items=3, width=1, hidden=2, dropout=0.0, kl_cap=0.2, anneal_steps=10, lam=0.0)
    plan = m.trainer(m)
    (schedule,), = plan.phases()
    weights = []
    for _ in range(4):
        weights.append(schedule.weight())
        m(batch([0], [[0, 2]]), schedule)
    assert weights == pytest.approx([0.0, 0.1, 0.2, 0.2])
    # the policy's state, in every checkpoint: a resumed run continues the schedule
    assert plan.state_dict() == {"updates": 4}
    resumed = m.trainer(m)
    resumed.load_state_dict(plan.state_dict())
    assert resumed.phases()[0][0].weight() == pytest.approx(0.2)
    # no schedule (a forward outside training's steps): the cap, the objective it ends with
    m.eval()
    kl = m(batch([0], [[0, 2]]))["kl"]
    assert float(kl) == pytest.approx(float(m(batch([0], [[0, 2]]), KLSchedule(0.2, 10, 10))["kl"]))


def test_is_positive_matches_sets():
    rng = np.random.default_rng(0)
    rows = [sorted(rng.choice(30, size=k, replace=False).tolist()) for k in (3, 0, 7, 1)]
    b = batch(list(range(4)), rows)
    cand = torch.randint(30, (len(b.train_items), 5))
    mask = is_positive(b.train_items, b.train_offsets, cand, 30)
    owners = [u for u, r in enumerate(rows) for _ in r]
    want = [[int(c) in set(rows[owners[n]]) for c in cand[n]] for n in range(len(owners))]
    assert mask.tolist() == want


def test_fold_in_negatives_depend_on_the_row_only():
    """The same row draws the same negatives in any batch, at any position; another row others."""
    a = batch([0, 1], [[1, 5, 9], [2, 3]])
    b = batch([7, 0, 3], [[4], [2, 3], [1, 5, 9]])
    na = hashed_negatives(a.train_items, a.train_offsets, 6, 1000)
    nb = hashed_negatives(b.train_items, b.train_offsets, 6, 1000)
    assert torch.equal(na[:3], nb[3:]) and torch.equal(na[3:], nb[1:3])
    assert not torch.equal(na[:2], na[3:])
    assert row_hash(torch.tensor([9, 1, 5]), torch.tensor([0])) == \
        row_hash(torch.tensor([1, 5, 9]), torch.tensor([0]))
    draws = hashed_negatives(torch.arange(200), torch.tensor([0]), 50, 10).flatten()
    counts = torch.bincount(draws, minlength=10).float()
    assert counts.min() > 0.8 * counts.mean()  # uniform enough over the catalogue


def test_bpr_fold_in_reaches_the_per_user_optimum():
    """Fold-in minimises the user's own loss with items frozen: no nearby vector does better by
    more than 0.1% (60 Adam steps stop short of the exact optimum by about that)."""
    torch.manual_seed(0)
    m = BPR(n_items=30, n_users=1, width=3, lam=0.01, neg_ratio=4)
    b = batch([0], [[1, 4, 7, 20]])
    u = m.fold_in(b.train_items, b.train_offsets)
    neg = hashed_negatives(b.train_items, b.train_offsets, 4, 30)

    keep = (~is_positive(b.train_items, b.train_offsets, neg, 30)).float()
    v = m.items.weight.detach()

    def loss(vec):
        scores = (vec @ v.T)[0]
        t = pair_losses(scores[b.train_items], scores[neg])
        return float((t * keep).sum() / keep.sum() + 0.01 * vec.pow(2).sum())

    best = loss(u)
    assert best < loss(torch.zeros(1, 3))
    for _ in range(50):
        assert best <= loss(u + 0.05 * torch.randn(1, 3)) * (1 + 1e-3)


def test_cml_points_stay_in_the_unit_ball():
    m = CML(n_items=5, n_users=2, width=3, margin=0.5, neg_ratio=2, cov_weight=0.0)
    m.items.weight.data *= 10
    assert float(clip(m.items.weight).norm(dim=1).max()) <= 1 + 1e-6
    b = batch([0], [[0, 3]])
    assert float(m.fold_in(b.train_items, b.train_offsets).norm(dim=1).max()) <= 1 + 1e-6


@pytest.mark.parametrize("make", [
    lambda: BPR(n_items=60, n_users=1, width=5, lam=0.01, neg_ratio=3),
    lambda: CML(n_items=60, n_users=1, width=5, margin=0.5, neg_ratio=4, cov_weight=0.0),
    lambda: CDAE(n_items=60, n_users=1, width=5, lam=0.01, dropout=0.5, neg_ratio=3),
    lambda: CDAE(n_items=60, n_users=1, width=5, lam=0.01, dropout=0.5, neg_ratio=0),
], ids=["bpr", "cml", "cdae", "cdae-whole-row"])
def test_fold_in_over_gathered_items_in_blocks_equals_the_dense_fold_in(make, monkeypatch):
    """The fold-in over gathered item vectors (all users in one block, or each its own) gives the
    vectors of the one over dense products with every item (all users at once)."""
    torch.manual_seed(0)
    m = make().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    rng = np.random.default_rng(1)
    rows = [sorted(rng.choice(60, size=k, replace=False).tolist()) for k in (5, 1, 12, 3, 30, 7)]
    b = batch(list(range(len(rows))), rows)
    monkeypatch.setattr(peruser, "GATHER_COST", 0)  # gathered, whatever the sizes
    fast = m.fold_in(b.train_items, b.train_offsets)
    monkeypatch.setattr(peruser, "FOLD_BLOCK_FLOATS", 1)  # every user its own block
    blocked = m.fold_in(b.train_items, b.train_offsets)
    monkeypatch.setattr(peruser, "GATHER_COST", 1 << 40)  # dense, all users at once
    calls = []
    monkeypatch.setattr(peruser, "in_blocks", lambda *a, **k: calls.append(a))
    dense = m.fold_in(b.train_items, b.train_offsets)
    assert not calls
    assert fast.shape == (len(rows), 5)
    assert float((fast - dense).abs().max()) < 1e-4, float((fast - dense).abs().max())
    assert float((blocked - dense).abs().max()) < 1e-4
    assert float(dense.abs().max()) > 0.05  # the fold-in moved every check off zero


def test_fold_rows_gathers_only_where_it_is_cheaper(monkeypatch):
    """20 positives and 4 draws a user: gathered (100 entries x 16) below 17k items, dense
    below 1.4k."""
    b = batch(list(range(3)), [list(range(20))] * 3)
    ways = []
    fold = lambda i, o, dots: ways.append(dots) or torch.zeros(len(o), 2)
    for n_items in (17_000, 1_400):
        peruser.fold_rows(fold, b.train_items, b.train_offsets, 4, 2, n_items)
    assert ways == [peruser.frozen_dots, peruser.dense_dots]


def test_in_blocks_splits_whole_users_within_the_budget(monkeypatch):
    monkeypatch.setattr(peruser, "FOLD_BLOCK_FLOATS", 10)
    rows = [[1, 2], [3], [4, 5, 6, 7, 8, 9], [0], [2, 3]]
    b = batch(list(range(5)), rows)
    seen = []

    def fold(items, offsets):
        seen.append([items[a:z].tolist() for a, z in
                     zip(offsets.tolist(), offsets[1:].tolist() + [len(items)])])
        return torch.ones(len(offsets), 1) * len(seen)

    out = peruser.in_blocks(fold, b.train_items, b.train_offsets, per_positive=2)
    # 2 floats a positive, 10 a block: [2 + 1 positives], [6 positives: alone, over budget], [1 + 2]
    assert seen == [[[1, 2], [3]], [[4, 5, 6, 7, 8, 9]], [[0], [2, 3]]]
    assert out[:, 0].tolist() == [1, 1, 2, 3, 3]


@pytest.mark.parametrize("make", [
    lambda: BPR(n_items=60, n_users=6, width=5, lam=0.01, neg_ratio=3),
    lambda: CML(n_items=60, n_users=6, width=5, margin=0.5, neg_ratio=4, cov_weight=0.1),
    lambda: CDAE(n_items=60, n_users=6, width=5, lam=0.01, dropout=0.5, neg_ratio=3),
], ids=["bpr", "cml", "cdae"])
def test_a_training_step_over_gathered_items_equals_the_dense_one(make, monkeypatch):
    """Training's pair scores (``peruser.pair_dots``) gathered or by the dense product give the
    same loss terms and the same gradients, item parameters included."""
    torch.manual_seed(0)
    m = make().train()
    rng = np.random.default_rng(2)
    rows = [sorted(rng.choice(60, size=k, replace=False).tolist()) for k in (5, 1, 12, 3, 30, 7)]
    b = batch(list(range(len(rows))), rows)
    out = {}
    for way, cost in (("gathered", 0), ("dense", 1 << 40)):
        monkeypatch.setattr(peruser, "TRAIN_GATHER_COST", cost)
        m.zero_grad()
        torch.manual_seed(7)  # the same draws (and CDAE's corruption) both ways
        terms = m(b)
        sum(terms.values()).backward()
        out[way] = ({k: float(v) for k, v in terms.items()},
                    {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    (t_g, g_g), (t_d, g_d) = out["gathered"], out["dense"]
    assert t_g == pytest.approx(t_d, rel=1e-5) and min(t_d.values()) > 0
    assert g_g.keys() == g_d.keys() and len(g_d) >= 2
    for name in g_d:
        assert torch.allclose(g_g[name], g_d[name], atol=1e-6), name
        assert float(g_d[name].abs().max()) > 0, name  # every trained parameter moved


def test_pair_dots_gathers_only_where_it_is_cheaper(monkeypatch):
    """20 positives and 4 draws a user: 100 entries x 48 gathered against 17k items, dense
    against 1.4k."""
    b = batch(list(range(3)), [list(range(20))] * 3)
    rows = peruser.row_ids(b.train_offsets, len(b.train_items))
    neg = torch.zeros(len(b.train_items), 4, dtype=torch.long)
    ways = []
    monkeypatch.setattr(peruser, "frozen_dots", lambda *a: ways.append("gathered") or (
        lambda u: (None, None)))
    monkeypatch.setattr(peruser, "pair_scores", lambda *a: ways.append("dense") or (None, None))
    for n_items in (17_000, 1_400):
        peruser.pair_dots(torch.zeros(3, 2), torch.zeros(n_items, 2), rows, b.train_items, neg)
    assert ways == ["gathered", "dense"]
