"""Loss pieces the models share: a sparse target made dense for a batch, and the L2 penalty.

Sparse targets use the EmbeddingBag layout of ``models.batch``: values for user i are
``idx[offsets[i]:offsets[i+1]]`` (the last user runs to the end). The AutoRec family's own losses
(MSE and negative sampling, dense and fast) are in ``models.autorec.losses``.
"""

from __future__ import annotations

import torch

from models.batch import row_ids


def densify(idx: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor | None,
            n_items: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, n_items) target (float32 unless ``dtype``) with ``values`` (ones if None) at the
    sparse positions."""
    out = torch.zeros(len(offsets), n_items, device=idx.device, dtype=dtype)
    vals = (torch.ones(len(idx), device=idx.device, dtype=dtype) if values is None
            else values.to(dtype))
    out[row_ids(offsets, len(idx)), idx] = vals
    return out


def l2_penalty(weights: list[torch.Tensor], lam: float, rows: torch.Tensor | None = None
               ) -> torch.Tensor:
    """lambda * sum over weight matrices of mean(W^2); with ``rows`` (one weight per row of every
    matrix, e.g. per item), lambda * sum over matrices of sum_i rows_i |W_i|^2 / numel(W)."""
    if rows is None:
        return sum(_MeanSquare.apply(w, lam) for w in weights)
    return sum(_RowMeanSquare.apply(w, rows, lam) for w in weights)


class _MeanSquare(torch.autograd.Function):
    """``lam * mean(w ** 2)`` in one read of ``w`` forward and one pass backward (autograd's pow
    keeps a copy of w and makes three passes over an (n, d) matrix: a tenth of a Yahoo-shape step)."""

    @staticmethod
    def forward(ctx, w, lam):
        ctx.save_for_backward(w)
        ctx.lam = lam
        flat = w.reshape(-1)
        return lam * flat.dot(flat) / w.numel()

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return w * (2 * ctx.lam * grad / w.numel()), None


class _RowMeanSquare(torch.autograd.Function):
    """``lam * sum_i rows_i * |w_i|^2 / numel(w)`` in one pass each way (``_MeanSquare`` with a
    weight per row; ``rows`` is a constant)."""

    @staticmethod
    def forward(ctx, w, rows, lam):
        ctx.save_for_backward(w, rows)
        ctx.lam = lam
        return lam * rows.dot(w.pow(2).sum(1)) / w.numel()

    @staticmethod
    def backward(ctx, grad):
        w, rows = ctx.saved_tensors
        return w * (rows * (2 * ctx.lam * grad / w.numel()))[:, None], None, None
