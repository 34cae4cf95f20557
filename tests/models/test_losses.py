"""Each loss against values computed by hand on a tiny batch."""

import math

import numpy as np
import pytest
import torch

from models.autorec import AutoRec
from models.autorec.losses import mse_loss, ns_loss
from models.losses import densify, l2_penalty
from models.registry import build

ls = lambda x: math.log(1 / (1 + math.exp(-x)))  # log sigmoid
SCORES = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 0.0]])
POS, POS_OFF = torch.tensor([0, 2, 1]), torch.tensor([0, 2])  # user 0: {0, 2}; user 1: {1}


def phases_of(model):
    """The phases of steps of the model's training policy, every option at its default."""
    return type(model).trainer(model).phases()


def test_densify():
    assert densify(POS, POS_OFF, None, 3).tolist() == [[1, 0, 1], [0, 1, 0]]


def test_mse_against_binary_rows():
    # (0.5-1)^2 + 0 + 0 + 0 + (2-1)^2 + 0 = 1.25 over 6 entries
    assert mse_loss(SCORES, POS, POS_OFF).item() == pytest.approx(1.25 / 6)


def test_mse_against_r_star_values():
    vals = torch.tensor([2.0, 0.5, 3.0])
    # (0.5-2)^2 + 0 + (1-0.5)^2 + 0 + (2-3)^2 + 0 = 2.25 + 0.25 + 1 = 3.5
    assert mse_loss(SCORES, POS, POS_OFF, vals).item() == pytest.approx(3.5 / 6)


def test_ns_loss_with_count_weighting():
    neg, counts, neg_off = torch.tensor([1, 0, 2]), torch.tensor([4, 1, 1]), torch.tensor([0, 1])
    u0 = ls(0.5) + ls(1.0) + (2 / 4) * 4 * ls(-0.0)  # |r|/|s| = 2/4
    u1 = ls(2.0) + (1 / 2) * (ls(-0.0) + ls(-0.0))    # |r|/|s| = 1/2
    got = ns_loss(SCORES, POS, POS_OFF, neg, counts, neg_off).item()
    assert got == pytest.approx(-(u0 + u1) / 2)


def test_ns_loss_user_without_negatives_counts_positives_only():
    neg, counts, neg_off = torch.tensor([1]), torch.tensor([3]), torch.tensor([0, 1])  # user 1: none
    u0 = ls(0.5) + ls(1.0) + (2 / 3) * 3 * ls(-0.0)
    u1 = ls(2.0)
    assert ns_loss(SCORES, POS, POS_OFF, neg, counts, neg_off).item() == pytest.approx(-(u0 + u1) / 2)


def test_l2_is_lambda_times_mean_square_per_matrix():
    a, b = torch.tensor([[1.0, 3.0]]), torch.tensor([[2.0], [0.0]])
    assert l2_penalty([a, b], 0.1).item() == pytest.approx(0.1 * (5.0 + 2.0))


def test_models_registry_and_shapes():
    m = build("nce-autorec", {"lam_units": "plain", "n_items": 7, "width": 4})
    out = m.head_scores(torch.tensor([0, 3, 6]), torch.tensor([0, 2]), ("nce", "predict"))
    assert set(out) == {"nce", "predict"} and out["predict"].shape == (2, 7)
    torch.testing.assert_close(m.score(torch.tensor([0, 3, 6]), torch.tensor([0, 2])), out["predict"])
    # the encoder is a sum of item columns: same as a dense linear layer on the binary row
    dense = torch.zeros(2, 7)
    dense[0, [0, 3]] = 1
    dense[1, 6] = 1
    h = torch.relu(dense @ m.encoder.weight + m.encoder_bias)
    torch.testing.assert_close(m.encode(torch.tensor([0, 3, 6]), torch.tensor([0, 2])), h)
    assert isinstance(m, AutoRec) and m.model_args() == {"n_items": 7, "width": 4, "lam": 10.0,
                                                         "lam_units": "plain", "mode": "joint",
                                                         "embed_weight": 1.0, "embed_lam": None}


def test_rstar_recomputed_for_another_beta_from_popularity():
    import numpy as np
    import pyarrow as pa

    from prepared.protocol import rstar_per_item
    from training.feed import batch_from_arrow

    pop = np.array([50, 5, 1, 0])
    z = 100
    rows = pa.table({"user_index": pa.array([0, 1], pa.int32()),
                     "train_items": pa.array([[0, 2], [1]], pa.list_(pa.int32())),
                     "train_rstar": pa.array([rstar_per_item(pop, z, 1.0)[[0, 2]].tolist(),
                                              rstar_per_item(pop, z, 1.0)[[1]].tolist()],
                                             pa.list_(pa.float32())),
                     "neg_items": pa.array([[], []], pa.list_(pa.int32())),
                     "neg_counts": pa.array([[], []], pa.list_(pa.int32()))})
    batch = batch_from_arrow(rows)
    # what the feed does for another beta (training.feed.BatchMaker): gather the per-item table
    gather = lambda beta: torch.from_numpy(rstar_per_item(pop, z, beta)).float()[batch.train_items]
    torch.testing.assert_close(gather(1.0), batch.train_rstar)  # same beta: the stored values
    expected = [max(math.log(z) - 1.3 * math.log(p), 0.0) for p in (50, 1, 5)]
    torch.testing.assert_close(gather(1.3), torch.tensor(expected, dtype=torch.float32))


def random_head(b=5, n=11, d=3, seed=0):
    """A float64 linear head, codes and sparse rows (distinct items per row; one row empty)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(b, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(n, generator=g, dtype=torch.float64, requires_grad=True)
    rows = [torch.randperm(n, generator=g)[:k] for k in (3, 0, 1, 7, n)[:b]]
    idx = torch.cat(rows)
    offsets = torch.tensor([0] + [len(r) for r in rows[:-1]]).cumsum(0)
    return h, w, bias, idx, offsets


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("with_values", [False, True], ids=["against-r", "against-rstar"])
def test_linear_mse_equals_the_dense_mse_with_its_gradients(with_values):
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = random_head()
    # float32-exact values: the dense reference's target (densify) is float32
    values = (torch.rand(len(idx)) * 3).double() if with_values else None
    dense = mse_loss(torch.nn.functional.linear(h, w, bias), idx, offsets, values)
    fast = linear_mse(h, w, bias, idx, offsets, values)
    assert fast.item() == pytest.approx(dense.item(), rel=1e-10)
    for a, b in zip(grads(fast, (h, w, bias)), grads(dense, (h, w, bias))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("pos_weight", [0.0, 2.5])
def test_linear_mse_with_l2_gives_the_mean_square_and_its_folded_gradient(pos_weight):
    """with_l2: the second output is mean(W^2) (the Gram's trace), and the gradient of loss +
    lam * mean(W^2), folded into the loss's product, equals the dense MSE's plus l2_penalty's
    (float64), with the gradient of h and b untouched by the L2."""
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = random_head(seed=5)
    values = (torch.rand(len(idx)) * 3).double()
    loss, square = linear_mse(h, w, bias, idx, offsets, values, pos_weight, with_l2=True)
    assert square.item() == pytest.approx((w.detach() ** 2).mean().item(), rel=1e-12)
    assert loss.item() == pytest.approx(
        linear_mse(h, w, bias, idx, offsets, values, pos_weight).item(), rel=1e-12)
    lam = 0.7
    fast = grads(loss + lam * square, (h, w, bias))
    dense = grads(mse_loss(torch.nn.functional.linear(h, w, bias), idx, offsets, values, pos_weight)
                  + l2_penalty([w], lam), (h, w, bias))
    for a, b in zip(fast, dense):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_positive_scores_in_chunks_equal_the_gathered_scores():
    """The confidence term's scores at the positives, a few pairs at a time (chunks of 3 over 22
    pairs, the last one short), equal the linear head's scores there (float64)."""
    from models.autorec.losses import linear_at, positive_scores
    from models.batch import row_ids

    h, w, bias, idx, offsets = random_head(seed=6)
    rows = row_ids(offsets, len(idx))
    want = linear_at(h, w, bias, rows, idx)
    for chunk in (3, len(idx), 4096):
        torch.testing.assert_close(positive_scores(h, w, bias, rows, idx, chunk=chunk), want,
                                   rtol=1e-12, atol=1e-12)
    dense = torch.nn.functional.linear(h, w, bias)
    torch.testing.assert_close(want, dense[rows, idx], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_bag_with_l2_equals_autograds_embedding_bag_and_mean_square(weighted):
    """The encoder's node: its sums and mean(V^2), and the gradient of V through both (one
    array), equal autograd's EmbeddingBag plus l2_penalty (float64); with dropout's per-entry
    weights (a dropped entry weighs 0) and without."""
    from models.autorec.losses import bag_with_l2

    _, v, _, idx, offsets = random_head(seed=7)
    weights = torch.tensor([0.0, 2.0] * (len(idx) // 2), dtype=torch.float64) if weighted else None
    g = torch.randn(len(offsets), v.shape[1], dtype=torch.float64)
    bag, square = bag_with_l2(idx, offsets, weights, v)
    want = torch.nn.functional.embedding_bag(idx, v, offsets, mode="sum",
                                             per_sample_weights=weights)
    torch.testing.assert_close(bag, want, rtol=1e-12, atol=1e-12)
    assert square.item() == pytest.approx((v.detach() ** 2).mean().item(), rel=1e-12)
    (got,) = grads((bag * g).sum() + 0.7 * square, (v,))
    (ref,) = grads((want * g).sum() + l2_penalty([v], 0.7), (v,))
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)


def test_target_transpose_is_the_sparse_target_times_h():
    """T'h per item with a positive (items sorted, each once), against the dense T' h in
    float64; an item no user has is absent, a repeated one sums its users."""
    from models.autorec.losses import target_transpose

    h = torch.randn(4, 3, dtype=torch.float64)
    idx = torch.tensor([5, 1, 1, 7, 5, 0])           # users: [5, 1], [1, 7, 5], [], [0]
    offsets = torch.tensor([0, 2, 5, 5])
    t = torch.tensor([1.0, 2.0, 0.5, 3.0, -1.0, 4.0], dtype=torch.float64)
    items, sums = target_transpose(idx, offsets, t, h)
    dense = densify(idx, offsets, t, 8, torch.float64)  # (users, items)
    assert items.tolist() == [0, 1, 5, 7]
    torch.testing.assert_close(sums, (dense.T @ h)[items], rtol=1e-12, atol=1e-12)


def test_linear_ns_equals_the_dense_ns_with_its_gradients():
    from models.autorec.losses import linear_ns

    h, w, bias, idx, offsets = random_head()
    neg = torch.tensor([1, 4, 4, 0, 9, 2, 10])  # user 1 (empty row) has negatives; user 4 none
    counts = torch.tensor([2, 1, 3, 1, 5, 1, 2])
    neg_off = torch.tensor([0, 2, 3, 5, 7])
    dense = ns_loss(torch.nn.functional.linear(h, w, bias), idx, offsets, neg, counts, neg_off)
    fast = linear_ns(h, w, bias, idx, offsets, neg, counts, neg_off)
    assert fast.item() == pytest.approx(dense.item(), rel=1e-10)
    for a, b in zip(grads(fast, (h, w, bias)), grads(dense, (h, w, bias))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name,mode", [("autorec", None), ("ohns-autorec", None),
                                       *[(m, mode) for m in ("ns-autorec", "nce-autorec")
                                         for mode in ("joint", "alternating", "limited-finetune",
                                                      "full-finetune")]])
def test_autorec_family_trains_the_same_through_the_fast_losses(name, mode):
    """Every step of every mode: the loss terms and every parameter's gradient through the exact
    fast losses equal those through the dense scores (float64)."""
    from models.batch import Batch

    torch.manual_seed(0)
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain",
            **({"mode": mode} if mode else {})}
    model = build(name, args).double()
    _, _, _, idx, offsets = random_head()
    batch = Batch(users=torch.arange(5), train_items=idx, train_offsets=offsets,
                  train_rstar=(torch.rand(len(idx)) * 3).double(),
                  neg_items=torch.tensor([1, 4, 4, 0, 9, 2, 10]),
                  neg_counts=torch.tensor([2, 1, 3, 1, 5, 1, 2]),
                  neg_offsets=torch.tensor([0, 2, 3, 5, 7]))
    for steps in phases_of(model):
        for step in steps:
            out = {}
            for dense in (False, True):
                model.dense_loss = dense
                model.zero_grad(set_to_none=True)
                terms = model(batch, step)
                sum(terms.values()).backward()
                out[dense] = ({k: v.item() for k, v in terms.items()},
                              {k: p.grad.clone() for k, p in model.named_parameters()
                               if p.grad is not None})
            (fast_terms, fast_grads), (dense_terms, dense_grads) = out[False], out[True]
            assert fast_terms == pytest.approx(dense_terms, rel=1e-10)
            assert fast_grads.keys() == dense_grads.keys() and fast_grads
            for k in fast_grads:
                torch.testing.assert_close(fast_grads[k], dense_grads[k], rtol=1e-6, atol=1e-12)


def test_autorec_picks_the_cheaper_loss_per_batch(monkeypatch):
    """Dense for a batch below 2/3 of the width, the fast losses from there on; the NS head dense
    unless asked (its gathered loss measured slower on a CPU)."""
    from models.autorec import model as autorec
    from models.batch import Batch

    calls = []
    zero = torch.tensor(0.0)
    monkeypatch.setattr(autorec, "linear_mse", lambda *a, **k: calls.append(len(a[0])) or
                        ((zero, zero) if k.get("with_l2") else zero))
    model = build("autorec", {"lam_units": "plain", "n_items": 11, "width": 6})
    for b in (3, 4):  # 3 * 3 < 2 * 6: dense; 3 * 4 >= 12: fast
        rows = [torch.tensor([1, 2])] * b
        model(Batch(users=torch.arange(b), train_items=torch.cat(rows),
                    train_offsets=torch.arange(b) * 2, train_rstar=torch.zeros(0),
                    neg_items=torch.zeros(0, dtype=torch.int64),
                    neg_counts=torch.zeros(0, dtype=torch.int64),
                    neg_offsets=torch.zeros(b, dtype=torch.int64)))
    assert calls == [4]
    ns = build("ohns-autorec", {"lam_units": "plain", "n_items": 11, "width": 6})
    assert ns.dense_for("ns", 10_000) and not model.dense_for("predict", 10_000)
    ns.dense_loss = False
    assert not ns.dense_for("ns", 1)


def test_l2_gradient_is_two_lambda_w_over_its_size():
    w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    (g,) = grads(l2_penalty([w], 0.7), (w,))
    torch.testing.assert_close(g, 2 * 0.7 * w.detach() / 12)
    assert torch.autograd.gradcheck(lambda x: l2_penalty([x], 0.7), (w,))


@pytest.mark.parametrize("needs", ["h", "w", "bias", "w+bias"])
def test_linear_mse_gradient_when_only_some_inputs_train(needs):
    """A frozen encoder (h without grad) or a frozen head: the hand-written backward returns
    each requested gradient alone, equal to the dense reference's."""
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = random_head(seed=3)
    tensors = {"h": h, "w": w, "bias": bias}
    for name, x in tensors.items():
        x.requires_grad_(name in needs.split("+"))
    wanted = [x for x in tensors.values() if x.requires_grad]
    fast = grads(linear_mse(h, w, bias, idx, offsets), wanted)
    dense = grads(mse_loss(torch.nn.functional.linear(h, w, bias), idx, offsets), wanted)
    for a, b in zip(fast, dense):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


def test_linear_mse_stays_float32_under_bf16_autocast():
    """The expansion subtracts terms of similar size: under autocast it must not run in bf16."""
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = (x.detach().float() if x.is_floating_point() else x
                                for x in random_head(b=5, n=11, d=3, seed=4))
    want = linear_mse(h, w, bias, idx, offsets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_mse(h, w, bias, idx, offsets)
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(want.item(), rel=1e-6)  # bf16 products: ~1e-2 off


# -- the levers beyond the paper (issue 32): each fast loss against its dense reference ------------

@pytest.mark.parametrize("with_values", [False, True], ids=["against-r", "against-rstar"])
def test_weighted_linear_mse_equals_the_weighted_dense_mse_with_its_gradients(with_values):
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = random_head(seed=5)
    values = (torch.rand(len(idx)) * 3).double() if with_values else None
    dense = mse_loss(torch.nn.functional.linear(h, w, bias), idx, offsets, values, pos_weight=4.0)
    fast = linear_mse(h, w, bias, idx, offsets, values, pos_weight=4.0)
    assert fast.item() == pytest.approx(dense.item(), rel=1e-10)
    for a, b in zip(grads(fast, (h, w, bias)), grads(dense, (h, w, bias))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)
    # and the weight is there: alpha = 0 is the unweighted loss, exactly as before
    plain = linear_mse(h, w, bias, idx, offsets, values)
    assert fast.item() > plain.item()
    assert linear_mse(h, w, bias, idx, offsets, values, pos_weight=0.0).item() == plain.item()


def test_weighted_mse_by_hand():
    # c = 1 + 2 at the positives: 3 (0.5-1)^2 + 0 + 0 + 0 + 3 (2-1)^2 + 0 = 3.75 over 6 entries
    assert mse_loss(SCORES, POS, POS_OFF, pos_weight=2.0).item() == pytest.approx(3.75 / 6)


def lever_batch(dtype=torch.float64):
    from models.batch import Batch

    _, _, _, idx, offsets = random_head()  # one empty row, one full row, duplicate-free
    return Batch(users=torch.arange(5), train_items=idx, train_offsets=offsets,
                 train_rstar=(torch.rand(len(idx), generator=torch.Generator().manual_seed(1))
                              * 3).to(dtype),
                 neg_items=torch.tensor([1, 4, 4, 0, 9, 2, 10]),
                 neg_counts=torch.tensor([2, 1, 3, 1, 5, 1, 2]),
                 neg_offsets=torch.tensor([0, 2, 3, 5, 7]))


LEVERED = [(m, mode, levers) for m, levers in (
    ("autorec", {"pos_weight": 3.0, "dropout": 0.4}),
    ("ns-autorec", {"pos_weight": 3.0, "dropout": 0.4}),
    ("ohns-autorec", {"dropout": 0.4}),
    ("nce-autorec", {"pos_weight": 3.0, "dropout": 0.4, "nce_scale": "rms",
                     "rstar_mean_square": 2.5}),
    ("nce-autorec", {"pos_weight": 3.0, "nce_scale": "head-weight", "rstar_mean_square": 2.5}),
    ("nce-autorec", {"pos_weight": 3.0, "nce_pos_weight": 20.0, "dropout": 0.4}),
    ("nce-autorec", {"nce_pos_weight": 5.0}),
    ("autorec", {"dropout": 0.5, "emphasis": 4.0}),
    ("nce-autorec", {"pos_weight": 3.0, "nce_pos_weight": 20.0, "dropout": 0.5,
                     "emphasis": 4.0}),
    ("autorec", {"pos_weight": 3.0, "pop_l2": 1.0}),
    ("nce-autorec", {"pos_weight": 3.0, "pop_l2": 0.5, "embed_lam": 2.0}),
    ("nce-autorec", {"embed_lam": 2.0}))
    for mode in ((None,) if m in ("autorec", "ohns-autorec") else
                 ("joint", "alternating", "limited-finetune", "full-finetune"))]


def step_terms_and_grads(model, batch, step, seed):
    torch.manual_seed(seed)  # the same dropout draw on each path
    model.zero_grad(set_to_none=True)
    terms = model(batch, step)
    sum(terms.values()).backward()
    return ({k: v.item() for k, v in terms.items()},
            {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("name,mode,levers", LEVERED,
                         ids=[f"{m}-{mode}-{'-'.join(lv)}" for m, mode, lv in LEVERED])
def test_the_levers_train_the_same_through_the_fast_losses(name, mode, levers):
    """Every step of every mode with the levers on: the loss terms and every gradient through the
    fast losses equal those through the dense scores (float64)."""
    torch.manual_seed(0)
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain",
            **({"mode": mode} if mode else {}), **levers}
    model = build(name, args).double()
    if model.pop_l2:
        model.set_item_popularity(torch.arange(11))
    batch = lever_batch()
    for steps in phases_of(model):
        for step in steps:
            out = {}
            for dense in (False, True):
                model.dense_loss = dense
                out[dense] = step_terms_and_grads(model, batch, step, seed=7)
            (fast_terms, fast_grads), (dense_terms, dense_grads) = out[False], out[True]
            assert fast_terms == pytest.approx(dense_terms, rel=1e-10)
            assert fast_grads.keys() == dense_grads.keys() and fast_grads
            for k in fast_grads:
                torch.testing.assert_close(fast_grads[k], dense_grads[k], rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("name", ["autorec", "nce-autorec"])
def test_the_levers_off_reproduce_the_paper_loss_exactly(name):
    """pos_weight 0, dropout 0 and nce_scale none give the same terms and gradients, bit for
    bit, as a model built without them (the paper's)."""
    off = {"pos_weight": 0.0, "dropout": 0.0, "pop_l2": 0.0, "emphasis": 0.0,
           **({"nce_scale": "none"} if name != "autorec" else {})}
    batch = lever_batch()
    out = []
    for args in ({}, off):
        torch.manual_seed(0)
        model = build(name, {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain",
                             **args}).double()
        out.append(step_terms_and_grads(model, batch, phases_of(model)[0][0], seed=3))
        assert not {"pos_weight", "dropout", "pop_l2", "emphasis"} & set(model.model_args())
    assert out[0][0] == out[1][0]
    for k in out[0][1]:
        assert torch.equal(out[0][1][k], out[1][1][k])


def test_the_nce_heads_own_confidence_weighs_its_positives_alone():
    """nce_pos_weight a: the NCE term is the dense reference with weight 1 + a on the positives
    (by hand: a second model whose pos_weight is a gives that term), the predict term keeps
    pos_weight's; unset, it is pos_weight, bit for bit, and the model file records it only when
    set."""
    from models.autorec.model import head_loss

    batch = lever_batch()
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain"}
    terms = {}
    for key, levers in (("own", {"pos_weight": 3.0, "nce_pos_weight": 20.0}),
                        ("same", {"pos_weight": 3.0, "nce_pos_weight": 3.0}),
                        ("unset", {"pos_weight": 3.0}), ("twenty", {"pos_weight": 20.0})):
        torch.manual_seed(0)
        model = build("nce-autorec", {**args, **levers}).double()
        model.dense_loss = False
        terms[key] = {k: v.item() for k, v in model(batch).items()}
        if key == "own":
            h = model.code(batch.train_items, batch.train_offsets)
            by_hand = head_loss("nce", model.heads["nce"](h), batch, pos_weight=20.0)
            assert terms[key]["nce"] == pytest.approx(by_hand.item(), rel=1e-12)
            assert model.model_args()["nce_pos_weight"] == 20.0
        if key == "unset":
            assert "nce_pos_weight" not in model.model_args()
    assert terms["same"] == terms["unset"]
    assert terms["own"]["predict"] == terms["unset"]["predict"]
    assert terms["own"]["nce"] == pytest.approx(terms["twenty"]["nce"], rel=1e-12)
    assert terms["own"]["nce"] != pytest.approx(terms["unset"]["nce"], rel=1e-3)


@pytest.mark.parametrize("name", ["autorec", "ns-autorec", "ohns-autorec"])
def test_only_a_model_with_an_nce_head_takes_its_confidence(name):
    with pytest.raises(ValueError, match="nce_pos_weight weighs the NCE head"):
        build(name, {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain",
                     "nce_pos_weight": 2.0})


@pytest.mark.parametrize("name", ["autorec", "nce-autorec"])
def test_the_popularity_scaled_l2_by_hand(name):
    """pop_l2 1 with training counts c = (0, 1, 2, 3, 9): w = (c + 1) / mean(c + 1) = (.25, .5,
    .75, 1, 2.5), and the L2 term is lam * omega-free scale * sum over the encoder and heads of
    sum_i w_i |W_i|^2 / numel(W); its gradient is autograd's of that formula (float64)."""
    torch.manual_seed(0)
    model = build(name, {"n_items": 5, "width": 2, "lam": 0.7, "lam_units": "plain",
                         "pop_l2": 1.0}).double()
    model.set_item_popularity([0, 1, 2, 3, 9])
    w = torch.tensor([0.25, 0.5, 0.75, 1.0, 2.5], dtype=torch.float64)
    torch.testing.assert_close(model.item_l2, w)
    mats = [model.encoder.weight, *(h.weight for h in model.heads.values())]
    by_hand = sum(0.7 * (w * (m ** 2).sum(1)).sum() / m.numel() for m in mats)
    expect = torch.autograd.grad(by_hand, mats)
    terms = model(lever_batch_for(5))
    assert terms["l2"].item() == pytest.approx(by_hand.item(), rel=1e-12)
    got = torch.autograd.grad(terms["l2"], mats)
    for g, e in zip(got, expect):
        torch.testing.assert_close(g, e)
    assert model.model_args()["pop_l2"] == 1.0 and "item_l2" not in model.state_dict()


def test_the_popularity_scaled_l2_weights_have_mean_one_at_any_exponent():
    model = build("autorec", {"n_items": 4, "width": 2, "lam": 1.0, "lam_units": "plain",
                              "pop_l2": 0.5})
    model.set_item_popularity([0, 3, 8, 15])
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])  # (c + 1) ** 0.5
    torch.testing.assert_close(model.item_l2, w / w.mean())


def test_the_popularity_scaled_l2_refuses_to_train_without_the_counts():
    model = build("autorec", {"n_items": 5, "width": 2, "lam": 1.0, "lam_units": "plain",
                              "pop_l2": 1.0})
    with pytest.raises(RuntimeError, match="needs the training items' popularity"):
        model(lever_batch_for(5))
    with pytest.raises(ValueError, match="3 item counts for 5 items"):
        model.set_item_popularity([1, 2, 3])


def test_the_training_policy_takes_the_counts_from_the_loop():
    """``build_model`` hands the train split's popularity to the policy's ``prepare``, which
    sets the weights: what every Ray Train worker does with ``WorkerPlan.popularity``."""
    from training.config import TrainConfig
    from training.loop import build_model

    cfg = TrainConfig(data="d", model="nce-autorec", pop_l2=1.0, lam_units="plain")
    model, _ = build_model(cfg, 5, None, {}, popularity=np.array([0, 1, 2, 3, 9]))
    torch.testing.assert_close(model.item_l2, torch.tensor([0.25, 0.5, 0.75, 1.0, 2.5]))
    plain, _ = build_model(TrainConfig(data="d", model="nce-autorec", lam_units="plain"), 5,
                           None, {}, popularity=np.array([0, 1, 2, 3, 9]))
    assert not plain.pop_l2 and not hasattr(plain, "item_l2")


def lever_batch_for(n_items: int):
    """Two users' rows over ``n_items`` items with R* values (no negatives)."""
    from models.batch import Batch

    idx = torch.tensor([0, 2, 1, 3, 4])
    return Batch(users=torch.arange(2), train_items=idx, train_offsets=torch.tensor([0, 2]),
                 train_rstar=torch.tensor([1.0, 2.0, 0.5, 1.5, 3.0], dtype=torch.float64),
                 neg_items=torch.tensor([], dtype=torch.long),
                 neg_counts=torch.tensor([], dtype=torch.long),
                 neg_offsets=torch.tensor([0, 0]))


def predict_on_the_draw(model, batch, p: float, seed: int = 11):
    """(the model's predict term, the dropout draw it made, the code of the corrupted row by the
    dense reference): the same draw replayed from ``seed``."""
    from models.autorec.model import dropout_weights

    idx, offsets = batch.train_items, batch.train_offsets
    torch.manual_seed(seed)
    got = model(batch)["predict"]
    torch.manual_seed(seed)
    keep = dropout_weights(len(idx), p, model.encoder.weight)
    x = densify(idx, offsets, keep, model.n_items, torch.float64)
    return got, keep, torch.relu(x @ model.encoder.weight + model.encoder_bias)


def test_dropout_is_the_dense_reference_on_the_corrupted_row_with_the_clean_target():
    """The encoder under dropout is the dense product of the corrupted row (each entry kept with
    1 - p, scaled 1 / (1 - p): ``dropout_weights``' draw), and the target stays the clean row."""
    p = 0.5
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain",
                              "n_items": 11, "width": 3, "lam": 0.0, "dropout": p}).double()
    model.dense_loss = True
    batch = lever_batch()
    idx, offsets = batch.train_items, batch.train_offsets
    got, keep, h = predict_on_the_draw(model, batch, p)
    assert set(keep.tolist()) == {0.0, 2.0}  # some dropped, the kept doubled
    want = mse_loss(model.heads["predict"](h), idx, offsets)  # against the uncorrupted row
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    assert got.item() != pytest.approx(model.eval()(batch)["predict"].item(), rel=1e-6)


def test_per_positive_weights_fast_equal_dense_and_by_hand():
    """A (nnz,) pos_weight: the fast loss equals the dense one with gradients (float64), a
    constant tensor equals the number, and the dense value is checked by hand."""
    from models.autorec.losses import linear_mse

    h, w, bias, idx, offsets = random_head(seed=5)
    per = torch.rand(len(idx), generator=torch.Generator().manual_seed(2)).double() * 5
    dense = mse_loss(torch.nn.functional.linear(h, w, bias), idx, offsets, pos_weight=per)
    fast = linear_mse(h, w, bias, idx, offsets, pos_weight=per)
    assert fast.item() == pytest.approx(dense.item(), rel=1e-10)
    for a, b in zip(grads(fast, (h, w, bias)), grads(dense, (h, w, bias))):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)
    same = torch.full((len(idx),), 4.0, dtype=torch.float64)
    assert linear_mse(h, w, bias, idx, offsets, pos_weight=same).item() == pytest.approx(
        linear_mse(h, w, bias, idx, offsets, pos_weight=4.0).item(), rel=1e-12)
    # SCORES' positives (0.5, 1 and 2 against 1) weigh 1 + 2, 1 + 5 and 1 + 6:
    # 3 (0.5-1)^2 + 6 (1-1)^2 + 7 (2-1)^2 = 7.75 over 6 entries
    assert mse_loss(SCORES, POS, POS_OFF, pos_weight=torch.tensor([2.0, 5.0, 6.0])).item() == \
        pytest.approx(7.75 / 6)


def test_emphasis_weighs_the_dropped_positives_alone():
    """emphasis e: a positive dropped from the input weighs 1 + pos_weight + e, a kept one
    1 + pos_weight: the predict term is the dense reference with those weights, on the code of
    the same draw."""
    p, e, a = 0.5, 4.0, 2.0
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": 11, "width": 3, "lam": 0.0,
                              "dropout": p, "pos_weight": a, "emphasis": e}).double()
    model.dense_loss = False
    batch = lever_batch()
    idx, offsets = batch.train_items, batch.train_offsets
    got, keep, h = predict_on_the_draw(model, batch, p)
    dropped = keep == 0
    assert dropped.any() and not dropped.all()
    scores = model.heads["predict"](h)
    want = mse_loss(scores, idx, offsets, pos_weight=a + e * dropped.double())
    assert got.item() == pytest.approx(want.item(), rel=1e-10)
    assert got.item() > mse_loss(scores, idx, offsets, pos_weight=a).item()
    assert model.model_args()["emphasis"] == e
    # in eval mode nothing is dropped, so nothing is emphasised: 1 + pos_weight on the clean code
    model.eval()
    clean = model.heads["predict"](model.encode(idx, offsets))
    assert model(batch)["predict"].item() == pytest.approx(
        mse_loss(clean, idx, offsets, pos_weight=a).item(), rel=1e-10)


@pytest.mark.parametrize("name,args", [("autorec", {"emphasis": 2.0}),
                                       ("ns-autorec", {"emphasis": -1.0, "dropout": 0.5})])
def test_emphasis_needs_dropout_and_a_predict_head(name, args):
    with pytest.raises(ValueError, match="emphasis weighs the positives --dropout drops"):
        build(name, {"lam_units": "plain", "n_items": 11, "width": 3, "lam": 0.0, **args})
    from models.registry import MODELS

    assert "emphasis" not in MODELS["ohns-autorec"].hyperparameters


def test_dropout_is_off_in_eval_and_when_scoring():
    torch.manual_seed(0)
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain"}
    plain = build("nce-autorec", args).double()
    torch.manual_seed(0)
    dropped = build("nce-autorec", {**args, "dropout": 0.7}).double()
    batch = lever_batch()
    idx, offsets = batch.train_items, batch.train_offsets
    dropped.eval()
    plain.eval()
    assert dropped(batch)["predict"].item() == plain(batch)["predict"].item()
    assert dropped(batch)["predict"].item() == dropped(batch)["predict"].item()
    dropped.train()  # scoring never drops, in either mode
    torch.testing.assert_close(dropped.score(idx, offsets), plain.score(idx, offsets))
    assert dropped(batch)["predict"].item() != dropped(batch)["predict"].item()  # two draws


def test_nce_scale_rms_and_head_weight_by_hand():
    """rms divides R* by sqrt(mean(R*^2)); head-weight divides the NCE loss by mean(R*^2)."""
    torch.manual_seed(0)
    batch = lever_batch()
    ms = 2.5
    models = {}
    for scale in ("none", "rms", "head-weight"):
        torch.manual_seed(0)
        extra = {"nce_scale": scale, "rstar_mean_square": ms} if scale != "none" else {}
        models[scale] = build("nce-autorec", {"lam_units": "plain", "n_items": 11, "width": 3, "lam": 0.5,
                                              **extra}).double()
    step = phases_of(models["none"])[0][0]
    nce = {k: m(batch, step)["nce"].item() for k, m in models.items()}
    scores = models["none"].head_scores(batch.train_items, batch.train_offsets, ("nce",))["nce"]
    rms_ref = mse_loss(scores, batch.train_items, batch.train_offsets,
                       batch.train_rstar / math.sqrt(ms))
    assert nce["rms"] == pytest.approx(rms_ref.item(), rel=1e-12)
    assert nce["head-weight"] == pytest.approx(nce["none"] / ms, rel=1e-12)
    assert models["rms"].model_args()["nce_scale"] == "rms"


def test_rstar_mean_square_is_over_the_training_positives():
    from types import SimpleNamespace

    import numpy as np

    from models.autorec.training import rstar_mean_square

    pop = np.array([3, 1, 0])
    table = lambda beta, tv: np.array([1.0, 2.0, 5.0]) * beta
    prep = SimpleNamespace(pop_train=pop, pop_train_valid=pop * 2, rstar_table=table,
                           beta=lambda: 1.0)
    # 3 positives at R* 1, one at 2: (3 + 4) / 4
    assert rstar_mean_square(prep, None, False) == pytest.approx(7 / 4)
    assert rstar_mean_square(prep, 2.0, False) == pytest.approx(4 * 7 / 4)


def test_phase_one_has_its_own_length_and_learning_rate():
    from types import SimpleNamespace

    model = build("nce-autorec", {"lam_units": "plain", "n_items": 11, "width": 3,
                                  "mode": "full-finetune"})
    plan = model.trainer(model, SimpleNamespace(loss_path="auto", finetune_init=None,
                                                 finetune_lr=1e-3, finetune_phase1_lr=5e-3,
                                                 finetune_phase1_epochs=7))
    assert [plan.phase_lr(p, 3e-4) for p in (0, 1)] == [5e-3, 1e-3]
    assert [plan.phase_epochs(p) for p in (0, 1)] == [7, 0]
    joint = build("nce-autorec", {"lam_units": "plain", "n_items": 11, "width": 3})
    plan = joint.trainer(joint)
    assert plan.phase_lr(0, 3e-4) == 3e-4 and plan.phase_epochs(0) == 0


def test_a_weighted_model_starts_fine_tune_phase_two_as_is():
    from types import SimpleNamespace

    model = build("nce-autorec", {"lam_units": "plain", "n_items": 11, "width": 3, "mode": "limited-finetune",
                                  "pos_weight": 2.0})
    plan = model.trainer(model, SimpleNamespace(loss_path="auto", finetune_init=None,
                                                 finetune_lr=None))
    assert not plan.start_from_ridge
    emphasised = build("nce-autorec", {"lam_units": "plain", "n_items": 11, "width": 3,
                                       "mode": "full-finetune", "dropout": 0.5, "emphasis": 4.0})
    plan = emphasised.trainer(emphasised, SimpleNamespace(loss_path="auto", finetune_init=None,
                                                          finetune_lr=None))
    assert not plan.start_from_ridge


def test_multinomial_loss_by_hand_and_its_gradient():
    """-sum over each user's items of log softmax(scores), over B * n entries; gradcheck in
    float64 (softmax(scores) * |items| - r per row, over B * n)."""
    from models.autorec.losses import multinomial_loss

    lse0 = math.log(math.exp(0.5) + 1 + math.exp(1.0))
    lse1 = math.log(1 + math.exp(2.0) + 1)
    by_hand = (-(0.5 - lse0) - (1.0 - lse0) - (2.0 - lse1)) / 6
    assert multinomial_loss(SCORES, POS, POS_OFF).item() == pytest.approx(by_hand, rel=1e-6)
    scores = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    idx, offsets = torch.tensor([0, 3, 6, 2]), torch.tensor([0, 3, 3])  # user 1 has no items
    assert torch.autograd.gradcheck(lambda s: multinomial_loss(s, idx, offsets), (scores,))
    multinomial_loss(scores, idx, offsets).backward()
    r = densify(idx, offsets, None, 7, torch.float64)
    want = (torch.softmax(scores, 1) * r.sum(1, keepdim=True) - r) / 21
    assert torch.allclose(scores.grad, want, atol=1e-12)


@pytest.mark.parametrize("name", ["autorec", "nce-autorec"])
def test_the_multinomial_predict_head_trains_dense_and_leaves_the_nce_head(name):
    """predict_loss multinomial: the predict term is the multinomial loss of the dense scores
    (even where the fast loss was asked for), the NCE term and the L2 are the MSE model's, bit
    for bit; the model file records the choice; the default start of phase 2 is as-is."""
    from models.autorec.losses import multinomial_loss
    from models.autorec.training import AutoRecTraining

    batch = lever_batch()
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain"}
    terms = {}
    for loss in ("mse", "multinomial"):
        torch.manual_seed(0)
        model = build(name, {**args, "predict_loss": loss}).double()
        model.dense_loss = False
        assert model.dense_for("predict", 4096) == (loss == "multinomial")
        terms[loss] = {k: v.item() for k, v in model(batch).items()}
    h = model.code(batch.train_items, batch.train_offsets)
    want = multinomial_loss(model.heads["predict"](h), batch.train_items, batch.train_offsets)
    assert terms["multinomial"]["predict"] == pytest.approx(want.item(), rel=1e-12)
    assert terms["multinomial"]["predict"] != pytest.approx(terms["mse"]["predict"], rel=1e-3)
    assert {k: v for k, v in terms["multinomial"].items() if k != "predict"} == \
        {k: v for k, v in terms["mse"].items() if k != "predict"}
    assert model.model_args()["predict_loss"] == "multinomial"
    assert build(name, model.model_args()).predict_loss == "multinomial"
    assert AutoRecTraining.default_finetune_init({"predict_loss": "multinomial"}) == "as-is"
    assert AutoRecTraining.default_finetune_init({"predict_loss": "mse"}) == "ridge"


def test_the_multinomial_predict_head_refuses_the_squared_error_levers():
    args = {"n_items": 11, "width": 3, "lam": 0.5, "lam_units": "plain",
            "predict_loss": "multinomial"}
    for lever in ({"pos_weight": 3.0}, {"dropout": 0.5, "emphasis": 2.0}):
        with pytest.raises(ValueError, match="multinomial loss has none of: drop them"):
            build("nce-autorec", {**args, **lever})
    with pytest.raises(ValueError, match="mse without a predict head"):
        build("ohns-autorec", args)
    assert "predict_loss" not in build("nce-autorec", {**args, "predict_loss": "mse"}).model_args()
