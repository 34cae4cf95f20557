"""The paper's ranking metrics, defined once (the authors' metric code; definitions in
protocol.md), in the two array libraries the stages compute them with.

For a user with truth set T (users with empty T are skipped) and a ranked list (best first, training
items already removed, at most ``L`` = 50 long):

    Precision@K = hits@K / K          Recall@K = hits@K / |T|   (not min(K, |T|))
    MAP@K       = mean over i = 1..K of Precision@i   (all K positions, hits or not)
    R-Precision = hits in the top min(|T|, L) / |T|
    NDCG        = sum over hit ranks r <= L of 1/log2(r+1)  /  sum_{i=1..|T|} 1/log2(i+1)
                  (the ideal DCG is not truncated at L)
    F1@K        = per-user harmonic mean of P@K and R@K (0 when both are 0), then averaged
    95% CI      = 1.96 * std(per-user values, ddof=0) / sqrt(number of evaluated users)

The common conventions of public benchmarks, reported beside them (an extension of the paper):

    NDCG@K (truncated) = sum over hit ranks r <= K of 1/log2(r+1) / sum_{i=1..min(|T|,K)} 1/log2(i+1)
    HR@K               = 1 when the top K hold at least one truth item, else 0 (hit rate)
    MRR@K              = 1 / rank of the first hit when it is within the top K, else 0

The paper's Recall@K (hits@K / |T|) is already the common Recall@K (e.g. LightGCN's evaluation);
VAE-CF's variant divides by min(K, |T|) instead and is not reported.

- numpy, every metric (``hit_matrix``, ``per_user``, ``summarise``): the reference the tests and
  benchmarks measure against.
- torch (``ndcg_recall``, ``hr_mrr``): validation on the device every epoch reports NDCG and
  Recall@K (training/validate.py finds the hits; this turns them into the numbers);
  ``tests/prepared/test_metrics.py`` checks each equals ``per_user`` within 1e-12.

Spark's per-user metrics (evaluation/spark_metrics.py's ``batch_metrics``: numpy on Arrow batches
on the executors, with Spark SQL's NDCG discounts) are a third implementation of the same
definitions; ``tests/evaluation/test_score_evaluate.py`` checks evaluate.py's equal to ``per_user`` user by
user, and their summary equal to ``summarise``.

Here, in prepared/, because training and evaluation may not import each other and both must use
these definitions. torch is imported inside ``ndcg_recall`` only: every stage and Spark's
executors import prepared/, and the numpy face needs no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from prepared.protocol import KS

if TYPE_CHECKING:
    import torch


def hit_matrix(recs: np.ndarray, truth: Sequence[np.ndarray]) -> np.ndarray:
    """(U, L) bool: whether each recommended item is in the user's truth set.

    ``recs`` (U, L) int item indices, best first (-1 pads lists shorter than L).
    """
    recs = np.asarray(recs)
    out = np.zeros(recs.shape, bool)
    for u, t in enumerate(truth):
        if len(t):
            out[u] = np.isin(recs[u], t) & (recs[u] >= 0)
    return out


def per_user(hits: np.ndarray, n_truth: np.ndarray, ks: Sequence[int] = KS) -> dict[str, np.ndarray]:
    """Per-user metric values for users with a non-empty truth set (others are dropped).

    ``hits`` (U, L) bool; ``n_truth`` (U,) int sizes of the truth sets.
    """
    keep = np.asarray(n_truth) > 0
    hits, n = hits[keep].astype(np.float64), np.asarray(n_truth)[keep].astype(np.float64)
    if hits.shape[1] < max(ks):  # a list shorter than K: the missing positions are misses
        hits = np.pad(hits, ((0, 0), (0, max(ks) - hits.shape[1])))
    length = hits.shape[1]
    cum = np.cumsum(hits, axis=1)  # hits@i for i = 1..L
    ranks = np.arange(1, length + 1)
    discount = 1.0 / np.log2(ranks + 1)
    out: dict[str, np.ndarray] = {}
    ideal_all = np.cumsum(1.0 / np.log2(np.arange(1, int(n.max(initial=1)) + 1) + 1))
    out["NDCG"] = (hits * discount).sum(axis=1) / ideal_all[n.astype(int) - 1]
    top_t = np.minimum(n, length).astype(int)
    out["R-Precision"] = cum[np.arange(len(n)), top_t - 1] / n
    first = np.where(hits.any(axis=1), hits.argmax(axis=1) + 1, length + 1)  # rank of the 1st hit
    for k in ks:
        p = cum[:, k - 1] / k
        r = cum[:, k - 1] / n
        out[f"Precision@{k}"] = p
        out[f"Recall@{k}"] = r
        out[f"MAP@{k}"] = (cum[:, :k] / ranks[:k]).sum(axis=1) / k
        out[f"F1@{k}"] = np.divide(2 * p * r, p + r, out=np.zeros_like(p), where=(p + r) > 0)
        ideal_k = ideal_all[np.minimum(n, k).astype(int) - 1]
        out[f"NDCG@{k} (truncated)"] = (hits[:, :k] * discount[:k]).sum(axis=1) / ideal_k
        out[f"HR@{k}"] = (cum[:, k - 1] > 0).astype(np.float64)
        out[f"MRR@{k}"] = np.where(first <= k, 1.0 / first, 0.0)
    return out


def summarise(values: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Mean, 95% CI half-width (ddof 0, over evaluated users) and user count per metric."""
    out = {}
    for name, v in values.items():
        n = len(v)
        out[name] = {"mean": float(v.mean()) if n else float("nan"),
                     "ci95": float(1.96 * v.std() / np.sqrt(n)) if n else float("nan"),
                     "users": n}
    return out


def ndcg_recall(hits: torch.Tensor, n_truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, on ``hits``' device: ``per_user``'s "NDCG"
    and "Recall@k" of lists k long.

    ``hits`` (B, k) float64, 1 where the item at that rank is in the user's truth set (a list
    shorter than k: zeros after its end); ``n_truth`` (B,) float64 sizes of the truth sets, >= 1.
    """
    import torch

    k = hits.shape[1]
    device = hits.device
    discount = 1.0 / torch.log2(torch.arange(2, k + 2, device=device, dtype=torch.float64))
    # the ideal DCG over all |T| truth items, not truncated at k
    ideal_all = torch.cumsum(1.0 / torch.log2(torch.arange(
        2, int(n_truth.max()) + 2, device=device, dtype=torch.float64)), 0)
    ndcg = (hits * discount).sum(dim=1) / ideal_all[n_truth.long() - 1]
    recall = hits.sum(dim=1) / n_truth
    return ndcg, recall


def hr_mrr(hits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (HR@k, MRR@k), each (B,) float64, of ``hits`` (B, k) as in ``ndcg_recall``:
    ``per_user``'s "HR@k" and "MRR@k"."""
    import torch

    k = hits.shape[1]
    found = hits.sum(dim=1) > 0
    # the first hit's rank: argmax returns the first maximum, a 1 where there is one
    first = hits.argmax(dim=1).to(torch.float64) + 1
    zero = torch.zeros_like(first)
    return found.to(torch.float64), torch.where(found & (first <= k), 1.0 / first, zero)
