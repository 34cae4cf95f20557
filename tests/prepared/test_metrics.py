"""Metrics pinned to hand-computed values, edge cases and properties."""

import math

import numpy as np
import pytest
import torch

from prepared.metrics import hit_matrix, hr_mrr, ndcg_recall, per_user, summarise
from prepared.protocol import TOP_K

D = lambda r: 1 / math.log2(r + 1)  # discount of rank r


def test_hand_computed_user():
    # list of 5, hits at ranks 1 and 3; |T| = 4 (two relevant items never recommended)
    recs = np.array([[10, 11, 12, 13, 14]])
    hits = hit_matrix(recs, [np.array([10, 12, 98, 99])])
    v = per_user(hits, np.array([4]), ks=(1, 3, 5))
    assert v["Precision@3"][0] == pytest.approx(2 / 3)
    assert v["Recall@3"][0] == pytest.approx(2 / 4)      # / |T|, not / min(K, |T|)
    assert v["Recall@1"][0] == pytest.approx(1 / 4)
    # MAP@5 = mean of P@1..P@5 = (1 + 1/2 + 2/3 + 2/4 + 2/5) / 5
    assert v["MAP@5"][0] == pytest.approx((1 + 1 / 2 + 2 / 3 + 2 / 4 + 2 / 5) / 5)
    assert v["R-Precision"][0] == pytest.approx(2 / 4)   # hits in the top |T| = 4
    assert v["NDCG"][0] == pytest.approx((D(1) + D(3)) / (D(1) + D(2) + D(3) + D(4)))
    p, r = 2 / 3, 2 / 4
    assert v["F1@3"][0] == pytest.approx(2 * p * r / (p + r))
    assert v["NDCG@1 (truncated)"][0] == pytest.approx(1.0)
    # NDCG@3 (truncated): hits at 1 and 3 over the ideal of min(|T|, 3) = 3 hits
    assert v["NDCG@3 (truncated)"][0] == pytest.approx((D(1) + D(3)) / (D(1) + D(2) + D(3)))
    assert v["HR@1"][0] == 1 and v["MRR@5"][0] == 1.0   # the first item is a hit


def test_hit_rate_and_reciprocal_rank_by_hand():
    # first hits at rank 3, rank 7, none; |T| = 2 each
    recs = np.arange(24).reshape(3, 8) + np.array([[0], [0], [12]])  # 0-7, 8-15, 28-35
    truth = [np.array([2, 5]), np.array([14, 99]), np.array([98, 99])]
    v = per_user(hit_matrix(recs, truth), np.array([2, 2, 2]), ks=(1, 5, 8))
    np.testing.assert_array_equal(v["HR@1"], [0, 0, 0])
    np.testing.assert_array_equal(v["HR@5"], [1, 0, 0])
    np.testing.assert_array_equal(v["HR@8"], [1, 1, 0])
    np.testing.assert_allclose(v["MRR@5"], [1 / 3, 0, 0])   # rank 7 is beyond 5
    np.testing.assert_allclose(v["MRR@8"], [1 / 3, 1 / 7, 0])  # only the first hit counts


def test_ideal_dcg_is_not_truncated_at_the_list_length():
    recs = np.arange(50)[None, :]
    truth = [np.arange(60)]  # 60 relevant, all 50 recommended are hits
    v = per_user(hit_matrix(recs, truth), np.array([60]))
    ideal60 = sum(D(i) for i in range(1, 61))
    assert v["NDCG"][0] == pytest.approx(sum(D(i) for i in range(1, 51)) / ideal60)
    assert v["NDCG"][0] < 1
    assert v["NDCG@50 (truncated)"][0] == pytest.approx(1.0)
    assert v["R-Precision"][0] == pytest.approx(50 / 60)


def test_edge_cases_empty_truth_no_hits_perfect_short_list():
    recs = np.array([[1, 2, 3], [4, 5, 6], [7, 8, -1]])
    truth = [np.array([], int), np.array([9]), np.array([7, 8])]
    v = per_user(hit_matrix(recs, truth), np.array([0, 1, 2]), ks=(1, 5))
    assert len(v["NDCG"]) == 2                          # the empty-truth user is skipped
    assert v["NDCG"][0] == 0 and v["F1@5"][0] == 0      # no hits
    assert v["NDCG"][1] == pytest.approx(1.0)           # perfect ranking
    assert v["Precision@5"][1] == pytest.approx(2 / 5)  # fewer candidates than K: misses
    assert v["MAP@5"][1] == pytest.approx((1 + 1 + 2 / 3 + 2 / 4 + 2 / 5) / 5)


def test_every_metric_is_in_unit_interval_and_ci_by_hand():
    rng = np.random.default_rng(0)
    recs = np.array([rng.permutation(100)[:50] for _ in range(200)])
    truth = [rng.choice(100, size=rng.integers(1, 30), replace=False) for _ in range(200)]
    v = per_user(hit_matrix(recs, truth), np.array([len(t) for t in truth]))
    for name, vals in v.items():
        assert ((vals >= 0) & (vals <= 1 + 1e-12)).all(), name
    s = summarise({"x": np.array([0.0, 1.0, 1.0, 0.0])})["x"]
    assert s["mean"] == 0.5 and s["users"] == 4
    assert s["ci95"] == pytest.approx(1.96 * 0.5 / 2)   # std (ddof 0) = 0.5


@pytest.mark.parametrize("k", [50, 10])
def test_the_torch_face_equals_the_numpy_face(k):
    """Validation's NDCG and Recall@k (torch) are evaluation's (numpy) on random lists: ranked
    from tied scores, some shorter than k, truth sets from 1 to 3x the list length."""
    rng = np.random.default_rng(k)
    n_users, n_items = 300, 400
    scores = torch.from_numpy(rng.integers(0, 4, size=(n_users, n_items)).astype(np.float64))
    recs = torch.topk(scores, k, dim=1).indices.numpy()  # ties broken however topk breaks them
    short = rng.random(n_users) < 0.3
    for u in np.flatnonzero(short):
        recs[u, rng.integers(0, k):] = -1  # a shorter list: the positions after it are misses
    truth = [rng.choice(n_items, rng.integers(1, 3 * TOP_K), replace=False) for _ in range(n_users)]
    n_truth = np.array([len(t) for t in truth])
    hits = hit_matrix(recs, truth)
    want = per_user(hits, n_truth, ks=(k,))
    ndcg, recall = ndcg_recall(torch.from_numpy(hits.astype(np.float64)),
                               torch.from_numpy(n_truth.astype(np.float64)))
    assert (n_truth > k).any() and short.any() and recall.sum() > 0
    np.testing.assert_allclose(ndcg.numpy(), want["NDCG"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(recall.numpy(), want[f"Recall@{k}"], rtol=0, atol=1e-12)
    hr, mrr = hr_mrr(torch.from_numpy(hits.astype(np.float64)))
    assert 0 < hr.mean() < 1 and (mrr < 1).any() and (mrr > 0).any()
    np.testing.assert_allclose(hr.numpy(), want[f"HR@{k}"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(mrr.numpy(), want[f"MRR@{k}"], rtol=0, atol=1e-12)
