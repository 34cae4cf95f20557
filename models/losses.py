"""The paper's losses as pure functions of scores and sparse targets (protocol.md, "Models").

Sparse targets use the EmbeddingBag layout of ``models.batch``: values for user i are
``idx[offsets[i]:offsets[i+1]]`` (the last user runs to the end).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from models.batch import row_ids


def densify(idx: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor | None,
            n_items: int) -> torch.Tensor:
    """(B, n_items) float32 target with ``values`` (ones if None) at the sparse positions."""
    out = torch.zeros(len(offsets), n_items, device=idx.device)
    vals = torch.ones(len(idx), device=idx.device) if values is None else values.to(out.dtype)
    out[row_ids(offsets, len(idx)), idx] = vals
    return out


def mse_loss(scores: torch.Tensor, idx: torch.Tensor, offsets: torch.Tensor,
             values: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over all B * n entries of (t - y)^2, t dense from the sparse target (r, or R*)."""
    target = densify(idx, offsets, values, scores.shape[1])
    return F.mse_loss(scores, target, reduction="mean")


def ns_loss(scores: torch.Tensor, pos_idx: torch.Tensor, pos_offsets: torch.Tensor,
            neg_idx: torch.Tensor, neg_counts: torch.Tensor, neg_offsets: torch.Tensor) -> torch.Tensor:
    """Negative-sampling loss with counts, the logistic form of the paper's eq. 3:

        L = -(1/B) sum_i [ sum_{j in r_i} log s(y_ij) + (|r_i| / |s_i|) sum_j s_ij log s(-y_ij) ]

    The paper's eq. 4 writes a plain inner product (a reward unbounded with a linear head); we use
    its logistic form, as protocol.md decides. Users without negatives contribute positives only.
    """
    b = scores.shape[0]
    pos_rows = row_ids(pos_offsets, len(pos_idx))
    neg_rows = row_ids(neg_offsets, len(neg_idx))
    pos_term = torch.zeros(b, device=scores.device).index_add_(
        0, pos_rows, F.logsigmoid(scores[pos_rows, pos_idx]))
    counts = neg_counts.to(scores.dtype)
    neg_term = torch.zeros(b, device=scores.device).index_add_(
        0, neg_rows, counts * F.logsigmoid(-scores[neg_rows, neg_idx]))
    n_pos = torch.zeros(b, device=scores.device).index_add_(
        0, pos_rows, torch.ones_like(pos_rows, dtype=scores.dtype))
    n_neg = torch.zeros(b, device=scores.device).index_add_(0, neg_rows, counts)
    weight = torch.where(n_neg > 0, n_pos / n_neg.clamp(min=1), torch.zeros_like(n_neg))
    return -(pos_term + weight * neg_term).mean()


def l2_penalty(weights: list[torch.Tensor], lam: float) -> torch.Tensor:
    """lambda * sum over weight matrices of mean(W^2)."""
    return lam * sum(w.pow(2).mean() for w in weights)
