"""A run's health: the popularity baseline's validation metrics (hand-computed and against the
model path's metrics of count scores), the classification ok / below-popularity / collapsed,
and where it is said (the epoch's WARNING lines, the progress line, the driver's line, the
experiment's table)."""

import math

import numpy as np
import pytest
import torch

from prepared.metrics import hit_matrix, per_user
from training.feed import ValidBatch
from training.validate import (
    COLLAPSED_RANK,
    batch_metrics,
    health,
    popularity_metrics,
    popularity_order,
    popularity_top,
)


def batch(train: list[list[int]], valid: list[list[int]]) -> ValidBatch:
    flat = lambda rows: (torch.tensor([i for r in rows for i in r], dtype=torch.int64),
                         torch.tensor(np.cumsum([0] + [len(r) for r in rows[:-1]]),
                                      dtype=torch.int64))
    return ValidBatch(*flat(train), *flat(valid))


def test_popularity_lists_and_metrics_by_hand():
    # counts 5, 3, 3, 1, 0: items 1 and 2 tie, the lower index first
    order = popularity_order(np.array([5, 3, 3, 1, 0]))
    assert order.tolist() == [0, 1, 2, 3, 4]
    vb = batch(train=[[0], [1, 2], [], [0, 1, 2, 3]], valid=[[2], [0, 4], [3], [4]])
    top = popularity_top(order, vb, k=2)
    # user 3 has one unseen item: her second slot holds a training item, never a hit
    assert top.tolist() == [[1, 2], [0, 3], [0, 1], [4, 0]]
    ndcg, recall = popularity_metrics(order, vb, k=2)
    l3 = 1 / math.log2(3)
    # user 0: hit at rank 2 of 1 truth; user 1: hit at rank 1 of 2 truths (ideal 1 + 1/log2 3);
    # user 2: no hit; user 3: hit at rank 1
    assert ndcg.tolist() == pytest.approx([l3, 1 / (1 + l3), 0.0, 1.0], abs=1e-12)
    assert recall.tolist() == pytest.approx([1.0, 0.5, 0.0, 1.0], abs=1e-12)


def test_popularity_metrics_equal_the_model_path_and_a_numpy_reference():
    """The same numbers as a model scoring every user with the training counts (distinct counts:
    no ties for topk to break its own way), and, with ties, as numpy's stable ranking."""
    rng = np.random.default_rng(1)
    n_items, b = 300, 60
    train = [sorted(rng.choice(n_items, rng.integers(0, 120), replace=False).tolist())
             for _ in range(b)]
    valid = [sorted(rng.choice(sorted(set(range(n_items)) - set(t)), rng.integers(1, 8),
                               replace=False).tolist()) for t in train]
    vb = batch(train, valid)
    distinct = rng.permutation(n_items) * 3 + 1
    ndcg, recall = popularity_metrics(popularity_order(distinct), vb)
    want = batch_metrics(torch.from_numpy(distinct.astype(np.float32)).expand(b, -1), vb)
    assert ndcg.numpy() == pytest.approx(want[0].numpy(), abs=1e-12)
    assert recall.numpy() == pytest.approx(want[1].numpy(), abs=1e-12)

    tied = rng.integers(0, 6, n_items)
    scores = np.tile(tied.astype(float), (b, 1))
    for u, t in enumerate(train):
        scores[u, t] = -np.inf
    recs = np.argsort(-scores, axis=1, kind="stable")[:, :50]
    ref = per_user(hit_matrix(recs, [np.array(v) for v in valid]),
                   np.array([len(v) for v in valid]))
    ndcg, recall = popularity_metrics(popularity_order(tied), vb)
    assert ndcg.numpy() == pytest.approx(ref["NDCG"], abs=1e-12) and ref["NDCG"].mean() > 0
    assert recall.numpy() == pytest.approx(ref["Recall@50"], abs=1e-12)


def test_health_classification():
    assert COLLAPSED_RANK == 2.0
    assert health(0.0200, 0.0190, 37.0) == "ok"
    assert health(0.0190, 0.0190, 37.0) == "below-popularity"  # level is not above
    assert health(0.0110, 0.0190, 1.0) == "below-popularity,collapsed"
    assert health(0.0500, 0.0190, 1.99) == "collapsed"
    assert health(0.0500, 0.0190, 2.0) == "ok"
    assert health(float("nan"), 0.0190, None) == "below-popularity"
    # unknowns are not findings: no popularity measured, a model without codes
    assert health(0.05, None, None) == "ok" and health(0.05, 0.01, float("nan")) == "ok"


def test_each_problem_is_warned_once_when_it_first_shows_and_the_line_shows_popularity():
    from training.config import TrainConfig
    from training.loop import health_warnings, new_progress, progress_line

    p = new_progress()
    p["popularity"] = {"ndcg": 0.0190, "recall_at_50": 0.08}
    rec = lambda e, ndcg, rank: {"epoch": e, "phase": 1, "loss_predict": 1.0, "valid_ndcg": ndcg,
                                 "valid_recall_at_50": 0.05, "valid_head_share": 0.9,
                                 "code_effective_rank": rank, "users_per_second": 10.0,
                                 "epoch_seconds": 1.0, "valid_seconds": 0.1, "valid_users": 9}
    p["best_ndcg"] = 0.0300
    assert health_warnings(rec(1, 0.0300, 12.0), p) == []
    p["best_ndcg"], p["bad_epochs"] = 0.0110, 1  # (a resumed run's best, not bettered since)
    first = health_warnings(rec(2, 0.0110, 1.0), p)
    assert len(first) == 2 and all(w.startswith("WARNING: epoch 2: ") for w in first)
    assert "below popularity" in first[0] and "0.0110" in first[0] and "0.0190" in first[0]
    assert "code collapsed" in first[1] and "1.00" in first[1]
    assert health_warnings(rec(3, 0.0100, 1.0), p) == []  # said once
    # a run gets its patience to rise above popularity: none of its first epochs cries wolf
    q = {**new_progress(), "popularity": {"ndcg": 0.0190, "recall_at_50": 0.08}, "best_ndcg": 0.01,
         "bad_epochs": 1}
    assert health_warnings(rec(5, 0.0100, 12.0), q, grace=5) == []
    # ... nor one that still climbs (its last epoch was its best)
    assert health_warnings(rec(6, 0.0100, 12.0), {**q, "bad_epochs": 0}, grace=5) == []
    assert "below popularity" in health_warnings(rec(6, 0.0100, 12.0), q, grace=5)[0]
    line = progress_line(rec(3, 0.0100, 1.0), p, TrainConfig(data="d", model="autorec"), 1, [1.0])
    assert "valid NDCG 0.0100 (pop 0.0190) Recall@50" in line


def test_the_driver_says_an_unhealthy_run_in_one_line():
    from training.train import health_warning

    s = {"health": "below-popularity,collapsed", "best_valid_ndcg": 0.011,
         "valid_ndcg_popularity": 0.019, "best_code_effective_rank": 1.0}
    line = health_warning(s, "r1")
    assert line.startswith("WARNING: run r1 is unhealthy (below-popularity,collapsed)")
    assert "0.0110" in line and "0.0190" in line and "effective rank 1.00" in line
    assert "\n" not in line
    assert health_warning({**s, "health": "ok"}, "r1") is None
    assert health_warning({"best_valid_ndcg": None}, "r1") is None  # final retraining


def test_an_unhealthy_run_is_pointed_at_the_confidence_on_positives_where_it_has_one():
    from training.config import TrainConfig
    from training.train import remedy

    assert "--pos-weight 10" in remedy(TrainConfig(data="d", model="autorec"))
    assert "--pos-weight" not in remedy(TrainConfig(data="d", model="autorec", pos_weight=3.0))
    bpr = remedy(TrainConfig(data="d", model="bpr"))
    assert "--pos-weight" not in bpr and bpr.startswith("try another --lr, --")  # its searched


def test_the_table_says_each_models_health():
    from evaluation.tables import table_csv
    from experiment.report import table_md, table_rows

    model = lambda h: {"chosen": {"point": {}, "valid_ndcg": 0.01, "trials": 1,
                                  "search_seconds": 60.0, **({"health": h} if h else {})},
                       "final": {"epochs_run": 1, "wall_seconds": 60.0}}
    state = {"models": {"autorec": {**model("below-popularity"), "evaluation_label": "autorec"},
                        "ease": {**model("ok"), "evaluation_label": "ease"},
                        "puresvd": {**model(None), "evaluation_label": "puresvd"}}}
    rows = [{"label": m, "group": "warm", "metric": "NDCG", "mean": 0.1, "ci95": 0.01,
             "users": 50} for m in state["models"]]
    t = table_rows(state, rows)
    md = table_md(t, "toy")
    assert "| final min | health |" in md and "below-popularity (its best validation" in md
    lines = md.splitlines()
    assert next(x for x in lines if x.startswith("| autorec")).endswith("| **below-popularity** |")
    assert next(x for x in lines if x.startswith("| ease")).endswith("| ok |")
    assert next(x for x in lines if x.startswith("| puresvd")).endswith("| – |")
    csv_lines = table_csv(t).splitlines()
    head = csv_lines[0].split(",")  # the seed columns follow health (experiment/run.py --seeds)
    assert head[head.index("users") + 1] == "health"
    assert [x.split(",")[head.index("health")] for x in csv_lines[1:]] == [
        "below-popularity", "ok", ""]
