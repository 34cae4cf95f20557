"""Validation NDCG and Recall@50 on the device, one batch at a time (protocol.md's definitions,
the same as ``evaluation.metrics``; a test checks the two agree).

Training items are removed from the ranking; NDCG's ideal DCG runs over all |T| validation items
(not truncated at 50); Recall@50 = hits@50 / |T|.
"""

from __future__ import annotations

import torch

from models.batch import row_ids
from prepared.protocol import TOP_K
from training.feed import ValidBatch



@torch.no_grad()
def batch_metrics(scores: torch.Tensor, batch: ValidBatch, k: int = TOP_K
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user (NDCG, Recall@k), each (B,) float64, from (B, n_items) scores."""
    b, n_items = scores.shape
    scores = scores.clone()
    scores[row_ids(batch.train_offsets, len(batch.train_items)), batch.train_items] = -torch.inf
    top = torch.topk(scores, min(k, n_items), dim=1).indices
    truth = torch.zeros(b, n_items, dtype=torch.bool, device=scores.device)
    truth[row_ids(batch.valid_offsets, len(batch.valid_items)), batch.valid_items] = True
    hits = torch.gather(truth, 1, top).to(torch.float64)
    # a top-k slot holding a training item (users with < k unseen items) is never a hit: the
    # training and validation sets are disjoint
    n_truth = truth.sum(dim=1).to(torch.float64)
    discount = 1.0 / torch.log2(torch.arange(2, top.shape[1] + 2, device=scores.device,
                                             dtype=torch.float64))
    ideal_all = torch.cumsum(1.0 / torch.log2(torch.arange(
        2, int(n_truth.max()) + 2, device=scores.device, dtype=torch.float64)), 0)
    ndcg = (hits * discount).sum(dim=1) / ideal_all[n_truth.long() - 1]
    recall = hits.sum(dim=1) / n_truth
    return ndcg, recall
