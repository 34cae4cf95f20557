"""lambda's units (issue 15): omega by hand, the loss terms under each unit against the plain form,
and runs or models from before the units existed keeping what they were."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.batch import Batch
from models.registry import build
from prepared.protocol import user_overlap


def test_user_overlap_is_the_mean_entry_of_the_user_gram():
    # c = (3, 1, 0, 2) over U = 4 users: sum c^2 / U^2 = (9 + 1 + 0 + 4) / 16
    assert user_overlap(np.array([3, 1, 0, 2]), 4) == pytest.approx(14 / 16)
    # against R R' formed: a random binary R, its users' shared-item counts averaged
    r = (np.random.default_rng(0).random((9, 13)) < 0.3).astype(float)
    assert user_overlap(r.sum(0), 9) == pytest.approx((r @ r.T).mean())
    with pytest.raises(ValueError, match="some positives"):
        user_overlap(np.zeros(3), 4)


def _batch(n_items: int) -> Batch:
    rows = [[0, 2], [1, 3, 4], [5]]
    idx = torch.tensor([i for r in rows for i in r])
    offsets = torch.tensor([0, 2, 5])
    negs = [[1, 3], [0], [2, 4]]
    return Batch(users=torch.arange(3), train_items=idx, train_offsets=offsets,
                 train_rstar=torch.linspace(0.5, 2.0, len(idx)),
                 neg_items=torch.tensor([i for r in negs for i in r]),
                 neg_counts=torch.tensor([2, 1, 3, 1, 1]),
                 neg_offsets=torch.tensor([0, 2, 3]))


@pytest.mark.parametrize("name", ["autorec", "ohns-autorec", "ns-autorec", "nce-autorec"])
def test_overlap_units_scale_the_l2_by_omega_and_put_the_ns_loss_per_entry(name):
    """Same weights, same batch: under overlap units the l2 term is omega times the plain
    one (lam * sum of mean(W^2), recomputed here), the NS head's loss is the plain (per-user) one
    over n_items, and the MSE heads' losses are unchanged."""
    n_items, omega = 6, 0.2
    torch.manual_seed(4)
    plain = build(name, {"n_items": n_items, "width": 3, "lam": 5.0, "lam_units": "plain"})
    units = build(name, {"n_items": n_items, "width": 3, "lam": 5.0, "lam_units": "overlap",
                         "overlap": omega})
    units.load_state_dict(plain.state_dict())
    batch = _batch(n_items)
    a, b = plain(batch), units(batch)
    trained = [plain.encoder.weight] + [plain.heads[h].weight for h in plain.heads_trained]
    by_hand = 5.0 * sum(float((w ** 2).mean()) for w in trained)
    assert a["l2"].item() == pytest.approx(by_hand, rel=1e-6)
    assert b["l2"].item() == pytest.approx(omega * by_hand, rel=1e-6)
    for head in plain.heads_trained:
        want = a[head].item() / n_items if head == "ns" else a[head].item()
        assert b[head].item() == pytest.approx(want, rel=1e-6), head


def test_overlap_units_need_the_datas_overlap():
    with pytest.raises(ValueError, match="user overlap"):
        build("autorec", {"n_items": 5, "width": 2, "lam": 1.0, "lam_units": "overlap"})


def test_a_model_saves_and_rebuilds_its_units():
    """model_args record lambda's units (and omega with the overlap units): a saved model
    rebuilds the form it trained in."""
    plain = build("nce-autorec", {"n_items": 5, "width": 2, "lam": 30.0, "mode": "joint",
                                  "lam_units": "plain"})
    again = build("nce-autorec", plain.model_args())
    assert (again.lam_units, again.lam_scale) == ("plain", 1.0)
    assert plain.model_args()["lam_units"] == "plain" and "overlap" not in plain.model_args()
    new = build("nce-autorec", {"n_items": 5, "width": 2, "lam": 10.0, "lam_units": "overlap",
                                "overlap": 2.5})
    again = build("nce-autorec", new.model_args())
    assert (again.lam_units, again.overlap, again.lam_scale) == ("overlap", 2.5, 2.5)


def _shipped_prepared():
    """A ``Prepared`` of the shipped ml-latest-small without the ETL (only its popularity is
    read here): ratings >= 4 as positives, each user's latest fifth held out as validation."""
    from pathlib import Path

    import pandas as pd

    from prepared.reader import Prepared

    r = pd.read_csv(Path(__file__).resolve().parents[2] / "data" / "ml-latest-small" /
                    "ratings.csv")
    r = r[r.rating >= 4].sort_values(["userId", "timestamp"])
    r["item"] = r.movieId.astype("category").cat.codes
    late = r.groupby("userId").cumcount(ascending=False) < r.groupby("userId").movieId \
        .transform("size") // 5
    n = int(r.item.max()) + 1
    users = r.userId.nunique()
    return Prepared(uri="memory://ml-latest-small", pop_train_valid=np.bincount(r.item, minlength=n),
                    pop_train=np.bincount(r.item[~late], minlength=n),
                    manifest={"dataset": "ml-latest-small",
                              "counts": {"users": users, "warm_users": users}})


@pytest.mark.parametrize("name", ["autorec", "nce-autorec"])
def test_the_final_retraining_gets_the_l2_that_validation_chose(name):
    """Issue 31: the model built for the final retraining (train+valid) has the effective L2
    (lam * omega) of the one validation trained, omega computed on train and recorded with its
    split, not train+valid's larger omega."""
    from dataclasses import replace

    from training.config import TrainConfig
    from training.loop import build_model
    from training.train import run_statistics, statistics_params

    prep = _shipped_prepared()
    chosen = TrainConfig(data="d", model=name, lam=3.0)
    final = replace(chosen, train_splits="train,valid", pretrain_epochs=5)

    def effective_l2(cfg):
        stats = run_statistics(cfg, prep, None)
        model, _ = build_model(cfg, prep.n_items, prep.n_users, stats["values"])
        return stats, model.lam * model.lam_scale

    (s_chosen, l2_chosen), (s_final, l2_final) = effective_l2(chosen), effective_l2(final)
    omega_train, omega_both = prep.user_overlap(False), prep.user_overlap(True)
    assert omega_both > 1.2 * omega_train  # the two splits' omegas differ: the test can fail
    assert l2_final == l2_chosen == pytest.approx(3.0 * omega_train)
    assert l2_final != pytest.approx(3.0 * omega_both)
    assert s_final == s_chosen == {"split": "train", "values": {"overlap": omega_train}}
    assert statistics_params(s_final) == {"overlap": omega_train, "data_statistics_split": "train"}


def test_a_run_resumes_with_the_data_statistics_it_recorded():
    """A resumed run keeps its record's statistics; a new one computes them on the train split,
    also for the final retraining."""
    from training.config import TrainConfig
    from training.train import run_statistics

    prep = _shipped_prepared()
    final = TrainConfig(data="d", model="autorec", train_splits="train,valid")
    recorded = {"split": "train", "values": {"overlap": 1.25}}
    assert run_statistics(final, prep, {"data_statistics": recorded}) == recorded
    assert run_statistics(final, prep, None) == {
        "split": "train", "values": {"overlap": prep.user_overlap(False)}}
    ease = TrainConfig(data="d", model="ease")
    assert run_statistics(ease, prep, None) == {"split": "train", "values": {}}
