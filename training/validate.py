"""Validation NDCG and Recall@50 on the device, one batch at a time: the top-k lists and their
hits here, the metrics' definitions in ``prepared.metrics`` (``ndcg_recall``, the protocol's
formulas shared with evaluation).

Training items are removed from the ranking; NDCG's ideal DCG runs over all |T| validation items
(not truncated at 50); Recall@50 = hits@50 / |T|.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from models.batch import row_ids
from prepared.metrics import ndcg_recall
from prepared.protocol import TOP_K
from training.feed import ValidBatch

# a run's health (``health``): its code is "collapsed" below this effective rank. Under 2 the
# users' codes lie close to one line, so every user's scores are nearly one vector scaled: the
# same list for everyone, popularity's kind of model however wide the code (the collapse seen on
# a 30k x 41k sparse set was 1.0 from the first epoch). An absolute floor, not a share of the
# width: a healthy, strongly regularised wide code may use few of its directions and still rank
# per user; a width-1 code is always collapsed, and is flagged so.
COLLAPSED_RANK = 2.0
HEALTHY = "ok"


@torch.no_grad()
def model_metrics(model, batch: ValidBatch, k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, of ``model``'s top k (``recommend``: users
    in cache-sized blocks, no (B, n_items) matrix kept)."""
    _, top = model.recommend(batch.train_items, batch.train_offsets, k)
    return top_metrics(top, batch)


@torch.no_grad()
def batch_metrics(scores: torch.Tensor, batch: ValidBatch, k: int = TOP_K
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, from (B, n_items) scores (left unchanged)."""
    scores = scores.clone()
    scores[row_ids(batch.train_offsets, len(batch.train_items)), batch.train_items] = -torch.inf
    return top_metrics(torch.topk(scores, min(k, scores.shape[1]), dim=1).indices, batch)


@torch.no_grad()
def top_metrics(top: torch.Tensor, batch: ValidBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, from (B, k) ranked item indices."""
    b, k = top.shape
    device = top.device
    # hits by lookup of (user, item) keys among the sorted validation keys: O(B k log nnz), where
    # a dense (B, n_items) truth matrix would cost more than the top-k itself
    n_truth = torch.diff(batch.valid_offsets, append=torch.tensor(
        [len(batch.valid_items)], device=device)).to(torch.float64)
    span = int(max(int(top.max()) if top.numel() else 0,
                   int(batch.valid_items.max()) if len(batch.valid_items) else 0)) + 1
    keys = row_ids(batch.valid_offsets, len(batch.valid_items)) * span + batch.valid_items
    keys = keys.sort().values
    query = torch.arange(b, device=device).unsqueeze(1) * span + top
    at = torch.searchsorted(keys, query).clamp(max=max(len(keys) - 1, 0))
    hits = (keys[at] == query).to(torch.float64) if len(keys) else torch.zeros(
        b, k, dtype=torch.float64, device=device)
    # a top-k slot holding a training item (users with < k unseen items) is never a hit: the
    # training and validation sets are disjoint
    return ndcg_recall(hits, n_truth)


def head_mask(n_items: int, head, device: torch.device | str = "cpu") -> torch.Tensor:
    """(n_items,) bool, True at the items of ``head`` (indices: the 10% most popular)."""
    mask = torch.zeros(n_items, dtype=torch.bool, device=device)
    # a copy: ``head`` may be a read-only array (from Ray's object store), which as_tensor would
    # share and warn about
    mask[torch.tensor(head, dtype=torch.long, device=device)] = True
    return mask


def head_share_sum(mask: torch.Tensor, top: torch.Tensor) -> float:
    """Summed over the users of ``top`` (B, k), each list's share of items in ``mask``."""
    return float(mask[top].float().mean(1).sum()) if top.numel() else 0.0


def popularity_order(popularity) -> torch.Tensor:
    """(n_items,) int64: the items by training count, most popular first; ties go to the lower
    item index (a stable sort, as ``prepared.protocol.head_items``), so the lists are
    deterministic."""
    return torch.from_numpy(np.argsort(-np.asarray(popularity), kind="stable").astype(np.int64))


@torch.no_grad()
def popularity_top(order: torch.Tensor, batch: ValidBatch, k: int = TOP_K) -> torch.Tensor:
    """(B, k) int64: the popularity baseline's top k of each user of ``batch``: the most popular
    items that are not among her training items, removed as a model's scores remove them. A
    user with fewer than k unseen items gets training items in her last slots, never a hit, as
    ``model.recommend`` does. Costs O(B (k + longest history) log nnz): counts, no model."""
    b, device = len(batch), batch.train_offsets.device
    k = min(k, len(order))
    lengths = torch.diff(batch.train_offsets, append=torch.tensor(
        [len(batch.train_items)], device=device))
    # the first k + |train| popular items always hold k unseen ones (or every item)
    m = min(len(order), k + (int(lengths.max()) if b else 0))
    cand = order[:m].to(device).unsqueeze(0).expand(b, m)
    span = len(order)
    keys = (row_ids(batch.train_offsets, len(batch.train_items)) * span + batch.train_items).sort().values
    query = torch.arange(b, device=device).unsqueeze(1) * span + cand
    at = torch.searchsorted(keys, query).clamp(max=max(len(keys) - 1, 0))
    seen = (keys[at] == query) if len(keys) else torch.zeros_like(query, dtype=torch.bool)
    # the unseen candidates first, each group in popularity order (a stable sort)
    pick = torch.sort(seen.to(torch.int8), dim=1, stable=True).indices[:, :k]
    return cand.gather(1, pick)


@torch.no_grad()
def popularity_metrics(order: torch.Tensor, batch: ValidBatch, k: int = TOP_K
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, of the popularity baseline (``order``:
    ``popularity_order`` of the training counts): the floor a trained model must beat, measured
    with the model's own metric code on the same users."""
    return top_metrics(popularity_top(order, batch, k), batch)


@torch.no_grad()
def validation_sums(model, batches, head: torch.Tensor | None = None,
                    popularity: torch.Tensor | None = None, trained_users: bool = False
                    ) -> tuple[dict[str, float], ValidBatch | None]:
    """The one validation loop, of training's epochs and of a closed-form fit: over ``batches``
    (``ValidBatch``es on the model's device), the sums over their users of NDCG and Recall@50
    of the model's top 50 (``recommend``: training items left out), with ``head`` (a
    ``head_mask``) of the share of the lists from those items, with ``popularity`` (a
    ``popularity_order``) of the popularity baseline's metrics on the same users; ``users``
    counts them. ``trained_users``: a per-user model scores from its trained user vectors.
    Also returns the first batch (a sample for diagnostics; None without a user). The caller
    sums over the ranks, or divides, as it needs."""
    sums = dict.fromkeys(("ndcg", "recall", "head", "pop_ndcg", "pop_recall", "users"), 0.0)
    first = None
    for vb in batches:
        _, top = model.recommend(vb.train_items, vb.train_offsets, TOP_K,
                                 users=vb.users if trained_users else None)
        ndcg, recall = top_metrics(top, vb)
        sums["ndcg"] += float(ndcg.sum())
        sums["recall"] += float(recall.sum())
        if head is not None:
            sums["head"] += head_share_sum(head, top)
        if popularity is not None:
            p_ndcg, p_recall = popularity_metrics(popularity, vb)
            sums["pop_ndcg"] += float(p_ndcg.sum())
            sums["pop_recall"] += float(p_recall.sum())
        sums["users"] += len(vb)
        if first is None:
            first = vb
    return sums, first


def health(best_ndcg: float | None, popularity_ndcg: float | None,
           code_rank: float | None) -> str:
    """"ok", or what is wrong with a run, comma-separated: "below-popularity" when its best
    validation NDCG is not above the popularity baseline's on the same users (a NaN counts as
    not above), "collapsed" when its code's effective rank at that epoch is below
    ``COLLAPSED_RANK``. An unknown value (None, or a model without codes) is not a finding."""
    problems = []
    if best_ndcg is not None and popularity_ndcg is not None and not best_ndcg > popularity_ndcg:
        problems.append("below-popularity")
    if code_rank is not None and not math.isnan(code_rank) and code_rank < COLLAPSED_RANK:
        problems.append("collapsed")
    return ",".join(problems) or HEALTHY
