"""The paper's mechanism, not just its arithmetic: NCE-AutoRec's NCE head regresses R* (a
popularity-debiased target), its predict head regresses r, and with beta = 0 and log Z = 1 the NCE
head is a second copy of AutoRec's. The fixtures give R* values far from 1 and from each other, so
a head that regressed r instead of R* (or the heads' targets swapped) fails every test here."""

import copy
import math

import numpy as np
import pytest
import torch

from models.batch import Batch
from models.registry import build
from prepared.protocol import rstar_per_item

# 4 users x 6 items; R* of a positive is its item's, as the ETL gathers it (rstar_per_item)
ROWS = [[0, 1, 4], [1, 2], [0, 3, 5], [2, 4, 5]]
POP = np.array([2, 2, 2, 1, 2, 2])  # training popularity of each item in ROWS


def batch_of(rstar_item: np.ndarray) -> Batch:
    idx = torch.tensor([i for r in ROWS for i in r])
    offsets = torch.tensor([0, *np.cumsum([len(r) for r in ROWS])[:-1]])
    return Batch(users=torch.arange(len(ROWS)), train_items=idx, train_offsets=offsets,
                 train_rstar=torch.tensor(rstar_item[idx.numpy()], dtype=torch.float32),
                 neg_items=torch.zeros(0, dtype=torch.long), neg_counts=torch.zeros(0, dtype=torch.long),
                 neg_offsets=torch.zeros(len(ROWS), dtype=torch.long))


def dense(values_at_positives: torch.Tensor, batch: Batch) -> np.ndarray:
    out = np.zeros((len(ROWS), 6))
    k = 0
    for u, r in enumerate(ROWS):
        for i in r:
            out[u, i] = values_at_positives[k]
            k += 1
    return out


@pytest.mark.parametrize("fast", [True, False])
def test_the_nce_term_is_the_mse_against_r_star_not_r(fast):
    """Through the model's own forward (fast and dense loss paths): with both heads at zero the
    NCE term is mean(R*^2) over every entry and the predict term mean(r^2); the bias gradients
    are -2/(B n) times R*'s and r's column sums."""
    rstar = np.array([0.3, 2.5, 4.0, 1.7, 0.9, 3.2])  # non-uniform, none equal to 1
    batch = batch_of(rstar)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": 6, "width": 4, "lam": 0.0})
    model.dense_loss = not fast
    with torch.no_grad():
        for head in model.heads.values():
            head.weight.zero_()
            head.bias.zero_()
    terms = model(batch)
    sum(terms[k] for k in ("nce", "predict")).backward()
    t_nce = dense(batch.train_rstar, batch)
    t_r = (t_nce > 0).astype(float)
    assert terms["nce"].item() == pytest.approx((t_nce ** 2).mean(), rel=1e-6)
    assert terms["predict"].item() == pytest.approx((t_r ** 2).mean(), rel=1e-6)
    n = t_nce.size
    np.testing.assert_allclose(model.heads["nce"].bias.grad.numpy(), -2 * t_nce.sum(0) / n, rtol=1e-5)
    np.testing.assert_allclose(model.heads["predict"].bias.grad.numpy(), -2 * t_r.sum(0) / n, rtol=1e-5)


@pytest.mark.slow  # 20 s of training: in make test, not in the edit loop
def test_trained_nce_head_reproduces_r_star_and_predict_head_reproduces_r():
    """A head with enough capacity to interpolate (width >= users, no L2) trained jointly: the
    NCE head's scores at the positives converge to R*, the predict head's to 1, both to 0 off the
    positives: each head's minimiser is its own target, so this fails if either regresses the
    other's."""
    rstar = np.array([0.3, 2.5, 4.0, 1.7, 0.9, 3.2])
    batch = batch_of(rstar)
    torch.manual_seed(0)
    model = build("nce-autorec", {"lam_units": "plain",
                                  "n_items": 6, "width": 8, "lam": 0.0, "mode": "joint"})
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in range(1500):
        opt.zero_grad()
        sum(model(batch).values()).backward()
        opt.step()
    with torch.no_grad():
        h = model.code(batch.train_items, batch.train_offsets)
        nce, pred = model.heads["nce"](h).numpy(), model.heads["predict"](h).numpy()
    t_nce = dense(batch.train_rstar, batch)
    np.testing.assert_allclose(nce, t_nce, atol=0.05)
    np.testing.assert_allclose(pred, (t_nce > 0).astype(float), atol=0.05)
    # and what it recommends comes from the predict head, not the NCE head
    with torch.no_grad():
        scores = model.score(batch.train_items, batch.train_offsets)
    np.testing.assert_allclose(scores.numpy(), pred, atol=1e-5)


def test_beta_zero_and_log_z_one_make_the_nce_head_a_second_autorec_head():
    """beta = 0 makes R* = log Z for every positive (popularity no longer matters); with Z = e it
    is r itself, so the NCE term equals the predict term whenever the heads are equal, and for any
    Z it is (log Z)^2 times the predict term of the head scaled by 1 / log Z."""
    assert np.allclose(rstar_per_item(POP, z=50.0, beta=0.0), math.log(50.0))
    torch.manual_seed(1)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": 6, "width": 4, "lam": 0.0})
    with torch.no_grad():
        model.heads["nce"].load_state_dict(model.heads["predict"].state_dict())
    terms = model(batch_of(rstar_per_item(POP, z=math.e, beta=0.0)))
    assert terms["nce"].item() == pytest.approx(terms["predict"].item(), rel=1e-6)

    c = math.log(50.0)
    with torch.no_grad():
        model.heads["nce"].weight.mul_(c)
        model.heads["nce"].bias.mul_(c)
    terms = model(batch_of(rstar_per_item(POP, z=50.0, beta=0.0)))
    assert terms["nce"].item() == pytest.approx(c ** 2 * terms["predict"].item(), rel=1e-5)


def test_r_star_falls_with_popularity_and_beta_sets_how_fast():
    """R* = max(log Z - beta log pop, 0): the debiasing the NCE head learns; per item, on the
    fixture's popularity and a wider one, against the formula by hand."""
    pop = np.array([1, 2, 10, 200, 0])
    got = rstar_per_item(pop, z=50.0, beta=0.8)
    want = [max(math.log(50) - 0.8 * math.log(p), 0.0) if p else 0.0 for p in pop]
    np.testing.assert_allclose(got, want)
    assert got[0] > got[1] > got[2] > got[3] == 0.0 and got[4] == 0.0  # clipped; unseen item: 0


@pytest.mark.parametrize("units,overlap", [("plain", None), ("overlap", 0.25)])
def test_the_ridge_start_is_the_minimiser_of_phase_two_and_equals_the_reference(units, overlap):
    """Fine-tune phase 2's start (``--finetune-init ridge``): the sums over batches solved by the
    model equal the reference solve over all rows at once (models.autorec.ridge.reference_head, at
    lambda in plain units: lam * omega), and at that head the gradient of phase 2's own loss
    (the model's forward, every user in one batch) vanishes: it is the minimiser, not just a
    formula, in either of lambda's units."""

    from models.autorec.ridge import reference_head as ridge_head

    n_items, users = 12, 40
    rows, table = random_rows(seed=3, n_items=n_items, users=users, longest=6)
    torch.manual_seed(0)
    model = build("nce-autorec", {"n_items": n_items, "width": 5, "lam": 2.0,
                                  "mode": "limited-finetune", "lam_units": units,
                                  "overlap": overlap}).double()
    idx = torch.tensor([i for r in rows for i in r])
    offsets = torch.tensor([0, *np.cumsum([len(r) for r in rows])[:-1]])
    gram = rtx = 0
    for lo in range(0, users, 16):  # in batches, as the loop sums them
        hi = min(lo + 16, users)
        g_, r_ = model.ridge_statistics(idx[offsets[lo]:offsets[hi] if hi < users else None],
                                        offsets[lo:hi] - offsets[lo])
        gram, rtx = gram + g_, rtx + r_
    model.set_ridge_head(gram, rtx, users)
    weight, bias = ridge_head(copy.deepcopy(model).float(), table, n_items, 2.0 * (overlap or 1.0))
    torch.testing.assert_close(model.heads["predict"].weight.float(), weight, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(model.heads["predict"].bias.float(), bias, rtol=1e-4, atol=1e-5)

    batch = Batch(users=torch.arange(users), train_items=idx, train_offsets=offsets,
                  train_rstar=torch.ones(len(idx), dtype=torch.float64),
                  neg_items=torch.zeros(0, dtype=torch.long), neg_counts=torch.zeros(0, dtype=torch.long),
                  neg_offsets=torch.zeros(users, dtype=torch.long))
    phase2 = model.trainer(model).phases()[1][0]
    terms = model(batch, phase2)
    sum(terms.values()).backward()
    assert set(terms) == {"predict", "l2"}
    head = model.heads["predict"]
    assert head.weight.grad.abs().max().item() < 1e-10 and head.bias.grad.abs().max().item() < 1e-10
    # and a nudge away from it raises the loss
    with torch.no_grad():
        head.weight.add_(0.01)
    assert sum(model(batch, phase2).values()).item() > sum(terms.values()).item()



@pytest.mark.parametrize("init", ["ridge", "as-is"])
def test_the_loop_hook_sets_the_ridge_start_only_when_asked(init):
    """``between_phases`` as the loop calls it when phase 1 ends (batches of this rank, the
    ranks' collectives): with --finetune-init ridge the predict head becomes the reference
    minimiser and the hook says so; with as-is it does nothing and the head stays as trained.
    A model without such work (BPR) keeps the default hook."""
    from types import SimpleNamespace

    from models.autorec.ridge import reference_head
    from training.loop import Ranks

    n_items, users = 10, 30
    rows, table = random_rows(seed=5, n_items=n_items, users=users, longest=5)
    torch.manual_seed(0)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": n_items, "width": 4, "lam": 3.0,
                                  "mode": "limited-finetune"})
    plan = model.trainer(model, SimpleNamespace(loss_path="auto", finetune_init=init,
                                                finetune_lr=None))
    before = model.heads["predict"].weight.detach().clone()

    def batches():  # two batches of 12 and 18 users, as a rank's shard arrives
        for part in (rows[:12], rows[12:]):
            idx = torch.tensor([i for r in part for i in r])
            offsets = torch.tensor([0, *np.cumsum([len(r) for r in part])[:-1]])
            yield _Rows(idx, offsets, len(part))

    said = plan.between_phases(0, batches, Ranks)
    head = model.heads["predict"]
    if init == "as-is":
        assert said is None and torch.equal(head.weight, before)
    else:
        weight, bias = reference_head(model, table, n_items, 3.0)
        assert said.startswith("phase 2 starts from the exact predict head") and "30 users" in said
        torch.testing.assert_close(head.weight.detach(), weight, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(head.bias.detach(), bias, rtol=1e-4, atol=1e-5)
        assert not torch.equal(head.weight, before)
    bpr = build("bpr", {"n_items": n_items, "n_users": users})
    assert bpr.trainer(bpr).between_phases(0, lambda: iter(()), Ranks) is None


class _Rows:
    """A batch as ``between_phases`` reads it: the rows' items and its length."""

    def __init__(self, items, offsets, n):
        self.train_items, self.train_offsets, self.n = items, offsets, n

    def __len__(self):
        return self.n

def test_the_embedding_heads_weight_and_its_own_l2():
    """--embed-weight scales the NCE term alone; --embed-lam replaces lam for the NCE head's
    matrix alone (l2 = lam (mean W_enc^2 + mean W_pred^2) + embed_lam mean W_nce^2, by hand)."""
    batch = batch_of(np.array([0.3, 2.5, 4.0, 1.7, 0.9, 3.2]))
    torch.manual_seed(2)
    plain = build("nce-autorec", {"lam_units": "plain", "n_items": 6, "width": 4, "lam": 0.5})
    torch.manual_seed(2)
    lever = build("nce-autorec", {"lam_units": "plain",
                                  "n_items": 6, "width": 4, "lam": 0.5, "embed_weight": 2.5,
                                  "embed_lam": 7.0})
    a, b = plain(batch), lever(batch)
    assert b["nce"].item() == pytest.approx(2.5 * a["nce"].item(), rel=1e-6)
    assert b["predict"].item() == pytest.approx(a["predict"].item(), rel=1e-6)
    ms = lambda w: float((w.detach() ** 2).mean())
    want = (0.5 * (ms(lever.encoder.weight) + ms(lever.heads["predict"].weight))
            + 7.0 * ms(lever.heads["nce"].weight))
    assert b["l2"].item() == pytest.approx(want, rel=1e-6)
    assert a["l2"].item() == pytest.approx(0.5 * (ms(plain.encoder.weight) + ms(
        plain.heads["predict"].weight) + ms(plain.heads["nce"].weight)), rel=1e-6)
    # saved and rebuilt with its levers
    assert type(lever)(**lever.model_args()).model_args() == lever.model_args()
    assert lever.model_args()["embed_weight"] == 2.5 and lever.model_args()["embed_lam"] == 7.0


def random_rows(seed: int, n_items: int, users: int, longest: int):
    """Each user's sorted training items (1..``longest`` of them, seeded) and the same rows as
    the Arrow table ``reference_head`` reads."""
    import pyarrow as pa

    g = torch.Generator().manual_seed(seed)
    rows = [sorted(torch.randperm(n_items, generator=g)[:int(k)].tolist())
            for k in torch.randint(1, longest + 1, (users,), generator=g)]
    return rows, pa.table({"train_items": pa.array(rows, pa.list_(pa.int32()))})
