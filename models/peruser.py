"""What the models with per-user parameters (BPR, CML, CDAE) share: negatives, and fold-in.

Training draws negatives with torch's generator (seeded per epoch and rank by the trainer), and
scores each positive and draw by ``pair_dots``: gathered item vectors on sparse rows, one dense
product on dense ones.

Scoring must be a function of the user's input row (``Recommender.score``): Spark scoring, the
MLflow pyfunc and the cold-start users (held out of training entirely, protocol.md) give rows, not
user indices. So these models **fold in** every user they score, the same way, warm or cold: the
user's vector is fitted by ``FOLD_STEPS`` Adam steps on the model's own per-user training loss with
every item parameter frozen, starting from zero (Rendle et al., "Revisiting the Performance of iALS
on Item Recommendation Benchmarks", 2022, evaluate so too). The trained user vectors serve to
train the item parameters and, where asked (``--valid-by trained``: ``Recommender.trained_scores``),
to validate each epoch at a hundredth of a fold-in's cost. WRMF does the same in closed form
(models/wrmf.py).

The fold-in negatives are not random but a hash of the user's row and the positive's position, so a
user's scores do not depend on the batch it is scored in or on any generator's state, and Adam is
elementwise, so each user's fit is its own: a batch scores exactly as its users one by one.

A fold-in touches only the items of the user's row and its draws, and they are frozen. Where those
are few next to the catalogue (sparse rows, many items), their vectors are gathered once
(``frozen_dots``) and a step costs O(nnz * (1 + draws) * width) instead of the O(users * n_items *
width) of a product with every item (``dense_dots``), with the users folded in blocks whose gathered
vectors stay in cache (``in_blocks``: those steps are memory-bound). ``fold_rows`` picks the
cheaper way per batch. Each user's fit is its own, so neither changes a result beyond float
rounding (tests/models/test_baseline_losses.py checks it). ``benchmarks/results/fold_in_speed.md``: on
citeulike-a (17k items, about 20 positives a row) a validation of every user runs 4-9x faster than
with the dense products; on ml-100k (1.4k items, denser rows) the dense products stay the faster
way and are kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.batch import row_ids

FOLD_STEPS = 60     # Adam steps per fold-in (benchmarks/results/fold_in.md: steps against NDCG)
FOLD_LR = 0.1
FOLD_BLOCK_FLOATS = 1 << 21  # gathered floats per fold-in block on a CPU (8 MiB: measured best)
# a gathered entry (one dot product, memory-bound) costs about as much as this many entries of the
# dense product (GEMM speed): 13-17 in benchmarks/results/fold_in_speed.md, on ml-100k and citeulike-a
GATHER_COST = 16
# the same in a training step, whose gathers also scatter gradients into the item vectors: the
# crossover lies between 24 (ml-100k's BPR, where the dense product wins) and 81 (citeulike-a's
# CML, where gathering wins; benchmarks/results/peruser_step_speed.md)
TRAIN_GATHER_COST = 48

Dots = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

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
    users' dense (B, n_items) scores. Where rows are dense next to the catalogue, one matrix
    product and a gather is several times faster than gathering (nnz, c, d) item vectors: the
    product runs at GEMM speed, the gather at memory speed (``pair_dots`` picks the way)."""
    return scores[rows, items], scores[rows[:, None], neg]


def frozen_dots(v: torch.Tensor, rows: torch.Tensor, items: torch.Tensor, neg: torch.Tensor
                ) -> Dots:
    """``u -> pair_scores(u @ v.T, rows, items, neg)`` for frozen item vectors ``v`` (n_items,
    width), without the product with every item: the vectors of each positive (nnz, width) and of
    its draws (nnz, c, width) are gathered once, and each call costs nnz * (1 + c) dot products:
    the fold-in's steps share one gather, the items being frozen. Gradients flow into ``v`` too
    where it is trained (``pair_dots``)."""
    v_pos, v_neg = v[items], v[neg]

    def dots(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        at = u.index_select(0, rows)  # its backward is an index_add, several times a u[rows]'s
        return (at * v_pos).sum(1), (v_neg * at.unsqueeze(1)).sum(2)

    return dots


def dense_dots(v: torch.Tensor, rows: torch.Tensor, items: torch.Tensor, neg: torch.Tensor
               ) -> Dots:
    """``frozen_dots`` by each user's product with every item: the faster way where rows are
    dense next to the catalogue, and the reference the fast way is tested against."""
    return lambda u: pair_scores(u @ v.T, rows, items, neg)


def pair_dots(u: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, items: torch.Tensor,
              neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A training step's ``pair_scores`` of users ``u`` (B, width) against item vectors ``v``
    (n_items, width), both trained, the cheaper way for this batch: gathered (``frozen_dots``,
    whose gathers backpropagate into ``v`` like any index) where the entries touched are few next
    to the users' whole rows of the catalogue, else one dense product. Equal up to float rounding.
    On citeulike-a's shape the gathered step (forward and backward) runs 1.1-4x faster, on
    ml-100k's the dense one 2-8x (benchmarks/results/peruser_step_speed.md)."""
    if gathers(len(items) * (1 + neg.shape[1]), len(u) * len(v), TRAIN_GATHER_COST):
        return frozen_dots(v, rows, items, neg)(u)
    return pair_scores(u @ v.T, rows, items, neg)


def gathers(entries: int, dense: int, cost: int) -> bool:
    """Whether gathering ``entries`` (user, item) dot products, each worth ``cost`` entries of
    the dense product, is cheaper than the ``dense`` entries of the users' whole rows."""
    return entries * cost < dense


def fold_rows(fold: Callable[[torch.Tensor, torch.Tensor, Callable[..., Dots]], torch.Tensor],
              items: torch.Tensor, offsets: torch.Tensor, draws: int, width: int, n_items: int
              ) -> torch.Tensor:
    """``fold(items, offsets, dots)`` -> (B, width), run the cheaper way for these rows: with
    ``frozen_dots`` over cache-sized blocks of users when the entries a fold-in touches (each
    positive and its ``draws``) are few next to the users' whole rows of the catalogue, else with
    ``dense_dots`` over every user at once."""
    if gathers(len(items) * (1 + draws), len(offsets) * n_items, GATHER_COST):
        return in_blocks(lambda i, o: fold(i, o, frozen_dots), items, offsets,
                         per_positive=(1 + draws) * width)
    return fold(items, offsets, dense_dots)


def in_blocks(fold: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], items: torch.Tensor,
              offsets: torch.Tensor, per_positive: int) -> torch.Tensor:
    """``fold(items, offsets)`` -> (B, width) over blocks of consecutive users whose gathered
    vectors (``per_positive`` floats a positive) stay within FOLD_BLOCK_FLOATS, each block at
    least one user; one block on a GPU, where a big kernel beats cache locality."""
    if items.device.type != "cpu" or len(offsets) < 2:
        return fold(items, offsets)
    ends = offsets[1:].tolist() + [len(items)]
    starts, used = [0], 0
    for b, end in enumerate(ends):
        cost = (end - (ends[b - 1] if b else 0)) * per_positive
        if used + cost > FOLD_BLOCK_FLOATS and b > starts[-1]:
            starts.append(b)
            used = 0
        used += cost
    parts = []
    for lo, hi in zip(starts, starts[1:] + [len(offsets)]):
        a, z = int(offsets[lo]), ends[hi - 1]
        parts.append(fold(items[a:z], offsets[lo:hi] - a))
    return torch.cat(parts)


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
