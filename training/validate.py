"""Validation NDCG and Recall@50 on the device, one batch at a time: the top-k lists and their
hits here, the metrics' definitions in ``prepared.metrics`` (``ndcg_recall``, the protocol's
formulas shared with evaluation).

Training items are removed from the ranking; NDCG's ideal DCG runs over all |T| validation items
(not truncated at 50); Recall@50 = hits@50 / |T|.
"""

from __future__ import annotations

import torch

from models.batch import row_ids
from prepared.metrics import ndcg_recall
from prepared.protocol import TOP_K
from training.feed import ValidBatch



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
