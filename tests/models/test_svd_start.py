"""``--start-from svd`` (models/autorec/start.py): epoch 0 is the linear closed form, and a run that
starts there never ends below it."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import scipy.sparse as sp
import torch

from models.autorec import AutoRec, NCEAutoRec, NSAutoRec
from models.autorec.start import svd_start
from models.nce_plrec import NCEPLRec
from prepared.errors import UsageError

USERS, ITEMS, WIDTH, LAM, OMEGA = 60, 40, 8, 10.0, 1.7


def data(seed: int = 0):
    """A binary users x items matrix with a planted low-rank pattern, and positive R* values on
    its entries (as the ETL's: larger for rarer items)."""
    rng = np.random.default_rng(seed)
    p = 1 / (1 + np.exp(-(rng.normal(size=(USERS, 3)) @ rng.normal(size=(3, ITEMS)) - 1)))
    r = sp.csr_matrix((rng.random((USERS, ITEMS)) < p).astype(np.float64))
    rstar = r.copy()
    rstar.data = (np.log(USERS) - 0.5 * np.log(np.asarray(r.sum(0)).ravel() + 1))[r.indices]
    return r, rstar


def rows(r: sp.csr_matrix) -> tuple[torch.Tensor, torch.Tensor]:
    """The matrix's rows in the EmbeddingBag layout (items, offsets)."""
    return torch.from_numpy(r.indices.astype(np.int64)), torch.from_numpy(r.indptr[:-1].astype(np.int64))


def scores(model, r) -> np.ndarray:
    with torch.no_grad():
        return model.eval().score(*rows(r)).double().numpy()


def test_nce_autorec_starts_as_nce_plrec_at_the_models_own_lambda():
    """The predict head's scores at epoch 0 are NCE-PLRec's of rank ``width`` at lambda = N lam
    omega / d (the model's L2 in ridge's summed form), fitted on the same R* with the same seed;
    the NCE head is R*'s ridge regression on the same codes."""
    r, rstar = data()
    model = NCEAutoRec(n_items=ITEMS, width=WIDTH, lam=LAM, overlap=OMEGA)
    line = svd_start(model, r, rstar, seed=3)
    assert "epoch 0 is NCE-PLRec" in line and "singular vectors of R*" in line
    lam = USERS * LAM * OMEGA / WIDTH
    ref = NCEPLRec(ITEMS, rank=WIDTH, lam=lam)
    ref.fit(r, rstar, seed=3)
    got, want = scores(model, r), scores(ref, r)
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    # no code dimension is cut by the ReLU on a training row: the start is linear there
    items, offsets = rows(r)
    with torch.no_grad():
        pre = model.encoder(items, offsets) + model.encoder_bias
        codes = model.encode(items, offsets).double().numpy()
    assert pre.min() >= -1e-5
    # the NCE head: (H'H + lam I)^-1 H'R* on H = R V, by numpy, V taken from the reference
    h = r @ ref.projection.double().numpy()
    y = np.linalg.solve(h.T @ h + lam * np.eye(WIDTH), (rstar.T @ h).T)
    with torch.no_grad():
        nce = model.heads["nce"](torch.from_numpy(codes).float()).double().numpy()
    assert np.abs(nce - h @ y).max() < 1e-4 * np.abs(h @ y).max()


def test_autorec_starts_as_plrec_by_a_dense_svd():
    """AutoRec's start is PLRec: the SVD of R (numpy's exact one here, at the planted rank 3,
    where the spectrum has a gap the randomized SVD resolves; the column signs cancel in the
    scores) and R's ridge regression on R V."""
    r, _ = data(1)
    k = 3
    model = AutoRec(n_items=ITEMS, width=k, lam=LAM, overlap=OMEGA)
    assert "epoch 0 is PLRec" in svd_start(model, r, None, seed=0)
    _, s, vt = np.linalg.svd(r.toarray())
    v = vt[:k].T * np.sqrt(s[:k])
    h = r @ v
    y = np.linalg.solve(h.T @ h + USERS * LAM * OMEGA / k * np.eye(k), h.T @ r.toarray())
    want = h @ y
    assert np.abs(scores(model, r) - want).max() < 1e-3 * np.abs(want).max()


def test_a_width_past_the_matrix_rank_pads_with_zero_columns():
    r, rstar = data(2)
    model = NCEAutoRec(n_items=ITEMS, width=ITEMS + 5, lam=LAM, overlap=OMEGA)
    svd_start(model, r, rstar, seed=0)
    w = model.encoder.weight.detach().numpy()
    assert np.isfinite(w).all() and (np.abs(w).sum(0) > 0).sum() <= ITEMS
    assert np.isfinite(scores(model, r)).all()


def test_the_ns_head_has_no_svd_start():
    r, _ = data()
    with pytest.raises(ValueError, match="NS head has no closed form"):
        svd_start(NSAutoRec(n_items=ITEMS, width=WIDTH, lam=LAM, overlap=OMEGA), r, None, 0)
    from prepared.errors import UsageError
    from training.config import TrainConfig, check

    with pytest.raises(UsageError, match="--start-from.*NS head.*autorec, nce-autorec"):
        check(TrainConfig(data="d", model="ns-autorec", start_from="svd"))


def table(r: sp.csr_matrix, valid: list[list[int]]) -> pa.Table:
    lists = pa.list_(pa.int32())
    return pa.table({"user_index": pa.array(range(r.shape[0]), pa.int32()),
                     "train_items": pa.array([r.indices[r.indptr[u]:r.indptr[u + 1]].tolist()
                                              for u in range(r.shape[0])], lists),
                     "valid_items": pa.array(valid, lists)})


@pytest.mark.parametrize("lr", [3e-3, 0.0])
def test_the_start_is_epoch_0_and_a_run_never_ends_below_it(lr, tmp_path):
    """Through the loop's own epochs (one process): the start is validated before epoch 1 and
    is the best until an epoch beats it. At learning rate 0 no epoch moves the weights, so each
    validates exactly as the start did (the loop trained from the start, not from a random
    model) and none beats it: the run's best is the start's weights."""
    from models.training import Training
    from training.config import TrainConfig
    from training.feed import FeedPlan
    from training.loop import LoopState, WorkerPlan, build_model, epochs, new_progress, table_shards
    from training.step import phase_optimizers

    r, _ = data(4)
    rng = np.random.default_rng(5)
    dense = r.toarray()
    valid = [rng.choice(np.flatnonzero(dense[u] == 0), 2, replace=False).tolist()
             for u in range(USERS)]
    rows_t = table(r, valid)
    cfg = TrainConfig(data="d", model="autorec", width=WIDTH, lam=1.0, lr=lr, epochs=4,
                      batch_size=16, patience=100, start_from="svd", output=str(tmp_path))
    assert AutoRec.trainer.starts_from_data(cfg)
    assert not Training.starts_from_data(cfg)
    stats = {"overlap": OMEGA}
    model, policy = build_model(cfg, ITEMS, USERS, stats)
    policy.start(r, None, cfg.seed)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    fresh, policy = build_model(cfg, ITEMS, USERS, stats)  # the loop loads the start itself
    plan = WorkerPlan(cfg=cfg, feed=FeedPlan(False, False, False, None, None, 0, 0),
                      n_items=ITEMS, n_users=USERS, data=stats, head_items=np.arange(4),
                      popularity=np.asarray(r.sum(0)).ravel(), start=start)
    fresh.load_state_dict(plan.start)
    state = LoopState(new_progress(), phase_optimizers(policy, policy.phases(), 0, lr))
    records = [rec for rec, _ in epochs(plan, fresh, policy, state,
                                        table_shards(rows_t, 16, 0, rows_t), torch.device("cpu"),
                                        quiet=True)]
    p = state.progress
    assert [rec["epoch"] for rec in records] == [0, 1, 2, 3, 4]
    assert p["start"]["valid_ndcg"] == records[0]["valid_ndcg"] > 0
    assert p["best_ndcg"] == max(rec["valid_ndcg"] for rec in records)
    assert p["best_ndcg"] >= p["start"]["valid_ndcg"]
    if p["best_epoch"] == 0:
        assert all(torch.equal(state.best[k], start[k]) for k in start)
    if lr == 0.0:
        assert p["best_epoch"] == 0
        assert all(rec["valid_ndcg"] == pytest.approx(records[0]["valid_ndcg"], abs=1e-9)
                   for rec in records)


def test_a_final_retraining_of_epochs_0_is_the_start_itself(tmp_path):
    """A chosen best epoch of 0 (the start) retrains as ``--epochs 0``: no step is taken, the
    loop yields one record and its best weights are the start's, bit for bit (the final's
    model is the validated one, not one epoch of Adam past it)."""
    from training.config import TrainConfig, check
    from training.feed import FeedPlan
    from training.loop import LoopState, WorkerPlan, build_model, epochs, new_progress, table_shards
    from training.step import phase_optimizers

    r, _ = data(4)
    rows_t = table(r, [[] for _ in range(USERS)])
    cfg = TrainConfig(data="d", model="autorec", width=WIDTH, lam=1.0, lr=3e-3, epochs=0,
                      batch_size=16, start_from="svd", train_splits="train,valid",
                      output=str(tmp_path))
    check(cfg)  # 0 is allowed here, and only here
    for bad in ({"start_from": "random"}, {"train_splits": "train"}):
        with pytest.raises(UsageError, match="0 only for a final retraining"):
            check(replace(cfg, **bad))
    stats = {"overlap": OMEGA}
    model, policy = build_model(cfg, ITEMS, USERS, stats)
    policy.start(r, None, cfg.seed)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    plan = WorkerPlan(cfg=cfg, feed=FeedPlan(False, False, False, None, None, 0, 0),
                      n_items=ITEMS, n_users=USERS, data=stats, head_items=np.arange(4),
                      popularity=np.asarray(r.sum(0)).ravel(), start=start)
    state = LoopState(new_progress(), phase_optimizers(policy, policy.phases(), 0, cfg.lr))
    out = list(epochs(plan, model, policy, state, table_shards(rows_t, 16, 0), torch.device("cpu"),
                      quiet=True))
    assert [rec["epoch"] for rec, _ in out] == [0] and out[0][1]["done"]
    p = state.progress
    assert p["epoch"] == 0 and p["history"] == [] and p["best_epoch"] == 0
    assert all(torch.equal(state.best[k], start[k]) for k in start)
    assert all(torch.equal(model.state_dict()[k], start[k]) for k in start)


def test_the_final_of_a_best_epoch_0_trains_0_epochs(tmp_path):
    from experiment.plan import ExperimentConfig
    from experiment.selection import final_config

    cfg = ExperimentConfig(data=str(tmp_path), models="autorec", grid="small")
    chosen = {"point": {"start_from": "svd"}, "best_epoch": 0, "phase_epochs": [10]}
    assert final_config(cfg, tmp_path, "autorec", chosen).epochs == 0
    assert final_config(cfg, tmp_path, "autorec", {**chosen, "best_epoch": 4}).epochs == 4
