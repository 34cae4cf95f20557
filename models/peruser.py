"""What the models with per-user parameters (BPR, CML, CDAE) share: negatives, and fold-in.

Training draws negatives with torch's generator (seeded per epoch and rank by the trainer).

Scoring must be a function of the user's input row (``Recommender.score``): Spark scoring, the
MLflow pyfunc and the cold-start users (held out of training entirely, protocol.md) give rows, not
user indices. So these models **fold in** every user they score, the same way, warm or cold: the
user's vector is fitted by ``FOLD_STEPS`` Adam steps on the model's own per-user training loss with
every item parameter frozen, starting from zero (Rendle et al., "Revisiting the Performance of iALS
on Item Recommendation Benchmarks", 2022, evaluate so too). The trained user vectors serve only to
train the item parameters. WRMF does the same in closed form (models/wrmf.py).

The fold-in negatives are not random but a hash of the user's row and the positive's position, so a
user's scores do not depend on the batch it is scored in or on any generator's state, and Adam is
elementwise, so each user's fit is its own: a batch scores exactly as its users one by one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.batch import row_ids

FOLD_STEPS = 60     # Adam steps per fold-in (benchmarks/results/fold_in.md: steps against NDCG)
FOLD_LR = 0.1

_MASK32 = 0xFFFFFFFF


def hash32(x: torch.Tensor) -> torch.Tensor:
    """An int64 tensor of values in [0, 2^32) mixed to look uniform (the 'lowbias32' integer hash:
    two xor-shift-multiply rounds; products stay below 2^63, so int64 never overflows)."""
    x = x & _MASK32
    x = ((x >> 16) ^ x) * 0x21F0AAAD & _MASK32
    x = ((x >> 15) ^ x) * 0x735A2D97 & _MASK32
    return (x >> 15) ^ x


def row_hash(items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(B,) a hash of each user's item set (order-free: a sum of item hashes)."""
    rows = row_ids(offsets, len(items))
    h = torch.zeros(len(offsets), dtype=torch.int64, device=items.device)
    return h.index_add_(0, rows, hash32(items + 0x9E3779B9)) & _MASK32


def hashed_negatives(items: torch.Tensor, offsets: torch.Tensor, per_positive: int,
                     n_items: int) -> torch.Tensor:
    """(nnz, per_positive) items drawn uniformly by hash of (user's row, position, draw): the same
    for the same row wherever it is scored. May hit the user's positives (``is_positive``)."""
    rows = row_ids(offsets, len(items))
    position = torch.arange(len(items), device=items.device) - offsets[rows]
    key = hash32(row_hash(items, offsets)[rows] ^ hash32(position))
    draws = torch.arange(per_positive, device=items.device)
    return hash32(key[:, None] * 0x10001 + draws[None, :]) % n_items


def uniform_negatives(nnz: int, per_positive: int, n_items: int, device) -> torch.Tensor:
    """(nnz, per_positive) items uniform over the catalogue, from torch's generator."""
    return torch.randint(n_items, (nnz, per_positive), device=device)


def is_positive(items: torch.Tensor, offsets: torch.Tensor, candidates: torch.Tensor,
                n_items: int) -> torch.Tensor:
    """Bool mask of ``candidates`` (nnz, c) that are positives of the row their entry belongs to
    (for rejecting sampled 'negatives' that the user actually likes)."""
    rows = row_ids(offsets, len(items))
    keys = torch.sort(rows * n_items + items).values
    want = rows[:, None] * n_items + candidates
    at = torch.searchsorted(keys, want).clamp(max=len(keys) - 1)
    return keys[at] == want if len(keys) else torch.zeros_like(candidates, dtype=torch.bool)


def pair_scores(scores: torch.Tensor, rows: torch.Tensor, items: torch.Tensor, neg: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The (nnz,) scores of each positive and the (nnz, c) scores of its draws, gathered from the
    users' dense (B, n_items) scores. Computing those by one matrix product and gathering is
    several times faster than gathering (nnz, c, d) item vectors: the product runs at GEMM speed,
    the gather at memory speed."""
    return scores[rows, items], scores[rows[:, None], neg]


def fold_in(loss: Callable[[torch.Tensor], torch.Tensor], n_users: int, width: int,
            device, steps: int = FOLD_STEPS) -> torch.Tensor:
    """(B, width) user vectors minimising ``loss(users)`` -> (B,) per-user losses, from zero,
    item parameters frozen (the caller computes them under no_grad or detached)."""
    users = torch.zeros(n_users, width, device=device, requires_grad=True)
    opt = torch.optim.Adam([users], lr=FOLD_LR)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            loss(users).sum().backward()
            opt.step()
    return users.detach()
