"""CML: collaborative metric learning (Hsieh, Yang, Cui, Lin, Belongie and Estrin, "Collaborative
Metric Learning", WWW 2017).

Users and items are points in R^d inside the unit ball; a user is recommended the items nearest
to them. For every training positive (u, i), ``neg_ratio`` items k are drawn uniformly (draws that
are u's positives are dropped) and, with d(., .) the Euclidean distance:

    hinge_ui = [ margin + d(u, i)^2 - min_k d(u, k)^2 ]_+
    w_ui     = log(1 + floor(n_items * impostors_ui / neg_ratio))      (the paper's WARP-style
               rank estimate; impostors = draws k with margin + d(u, i)^2 - d(u, k)^2 > 0)
    loss     = mean over positives of w_ui * hinge_ui
               + cov_weight * (|C|_F^2 - |diag C|^2) / batch rows           (optional, default off)

C is the covariance of the batch's user and item vectors (the paper's decorrelation term).
Scores are -d(u, j)^2.

Deviations: the unit-ball constraint is a reparametrisation, x -> x / max(1, |x|), applied in every
forward and in scoring, instead of the paper's projection after each update (the same feasible set;
a DDP step then needs no post-step hook); the hinge uses the closest of the drawn negatives, as the
authors' code does; Adam on mini-batches of users; scoring folds each user in (models/peruser.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from models.base import Recommender
from models.batch import Batch, row_ids
from models.hparams import HP, NEG_RATIO_HELP, PAPER_WIDTHS, WIDTH_HELP
from models.peruser import (
    FOLD_STEPS,
    fold_in,
    fold_rows,
    hashed_negatives,
    is_positive,
    pair_dots,
    uniform_negatives,
)
from models.training import Training


def clip(x: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` with a norm above 1 scaled back onto the unit sphere."""
    return x / x.norm(dim=-1, keepdim=True).clamp(min=1.0)


class CML(Recommender):
    name = "cml"
    per_user = True
    score_in_blocks = False  # a fold-in per call (models/peruser.py), in blocks of its own
    hyperparameters = {
        "width": HP(64, WIDTH_HELP, lo=1, hi=100_000, search={"paper": PAPER_WIDTHS}),
        "margin": HP(0.5, "hinge margin", lo=0, open_lo=True, hi=4,
                     why="squared distances in the unit ball are at most 4",
                     search={"small": [0.5, 1.0]}),
        "neg_ratio": HP(10, NEG_RATIO_HELP, lo=1, hi=10_000, why="0, the whole row, is cdae's"),
        "cov_weight": HP(0.0, "weight of the covariance regulariser, 0 = off", lo=0, hi=1e6,
                         open_hi=True),
    }
    # its rate probed on ml-100k validation (README, "Models"); the covariance term regularises
    trainer = Training.tuned(learning_rate=3e-3, regularisers=frozenset({"cov"}))

    def __init__(self, n_items: int, n_users: int, width: int, margin: float, neg_ratio: int,
                 cov_weight: float):
        super().__init__()
        if n_items < 1 or n_users < 1 or width < 1 or margin <= 0 or neg_ratio < 1 or cov_weight < 0:
            raise ValueError(f"need n_items, n_users, width, neg_ratio >= 1, margin > 0 and "
                             f"cov_weight >= 0; got {n_items}, {n_users}, {width}, {neg_ratio}, "
                             f"{margin}, {cov_weight}")
        self.n_items, self.n_users, self.width = n_items, n_users, width
        self.margin, self.neg_ratio, self.cov_weight = float(margin), neg_ratio, float(cov_weight)
        self.users = nn.Embedding(n_users, width)
        self.items = nn.Embedding(n_items, width)
        # the authors' code: N(0, 1/sqrt(d)), i.e. points of norm about 1
        nn.init.normal_(self.users.weight, std=1 / math.sqrt(width))
        nn.init.normal_(self.items.weight, std=1 / math.sqrt(width))

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "n_users": self.n_users, "width": self.width,
                "margin": self.margin, "neg_ratio": self.neg_ratio, "cov_weight": self.cov_weight}

    def forward(self, batch: Batch, step=None) -> dict[str, torch.Tensor]:
        items, offsets = batch.train_items, batch.train_offsets
        neg = uniform_negatives(len(items), self.neg_ratio, self.n_items, items.device)
        valid = ~is_positive(items, offsets, neg, self.n_items)
        u, v = clip(self.users(batch.users)), clip(self.items.weight)
        loss = weighted_hinge(*distances(u, v, row_ids(offsets, len(items)), items, neg), valid,
                              self.margin, self.n_items)
        terms = {"hinge": loss.mean() if len(loss) else loss.sum()}
        if self.cov_weight > 0:
            touched = torch.cat([u, v[torch.unique(torch.cat([items, neg.flatten()]))]])
            terms["cov"] = self.cov_weight * covariance_penalty(touched)
        return terms

    def fold_in(self, items: torch.Tensor, offsets: torch.Tensor,
                steps: int = FOLD_STEPS) -> torch.Tensor:
        """(B, width) clipped user points fitted to their rows (the mean weighted hinge over the
        row's positives), items frozen and gathered once."""
        return fold_rows(lambda i, o, dots: self.fold_block(i, o, dots, steps), items, offsets,
                         self.neg_ratio, self.width, self.n_items)

    def fold_block(self, items: torch.Tensor, offsets: torch.Tensor, item_dots, steps: int
                   ) -> torch.Tensor:
        neg = hashed_negatives(items, offsets, self.neg_ratio, self.n_items)
        valid = ~is_positive(items, offsets, neg, self.n_items)
        rows, b = row_ids(offsets, len(items)), len(offsets)
        with torch.no_grad():
            v = clip(self.items.weight)
            vn = v.pow(2).sum(1)
            vn_pos, vn_neg = vn[items], vn[neg]
        dots = item_dots(v, rows, items, neg)
        counts = torch.zeros(b, device=items.device).index_add_(
            0, rows, torch.ones(len(items), device=items.device)).clamp(min=1)

        def loss(u: torch.Tensor) -> torch.Tensor:
            u = clip(u)
            d_pos, d_neg = squared(u.pow(2).sum(1)[rows], *dots(u), vn_pos, vn_neg)
            per = weighted_hinge(d_pos, d_neg, valid, self.margin, self.n_items)
            return torch.zeros(b, device=u.device).index_add_(0, rows, per) / counts

        return clip(fold_in(loss, b, self.width, items.device, steps))

    def score_users(self, u: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor
                    ) -> torch.Tensor:
        """(B, n_items) scores -|clip(u) - clip(v)|^2 of users with these points (B, width):
        ``score`` after its fold-in, or a training user's trained point (benchmarks/fold_in.py
        compares the two)."""
        u, v = clip(u), clip(self.items.weight)  # clip leaves fold-in's points as they are
        return 2 * u @ v.T - u.pow(2).sum(1, keepdim=True) - v.pow(2).sum(1)

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.score_users(self.fold_in(items, offsets), items, offsets)


def distances(u: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, items: torch.Tensor,
              neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared distances of each positive (nnz,) and of its draws (nnz, c) to their user, as
    |u|^2 - 2 u.v + |v|^2 from the dot products (``pair_dots``, models/peruser.py)."""
    un, vn = u.pow(2).sum(1), v.pow(2).sum(1)
    return squared(un[rows], *pair_dots(u, v, rows, items, neg), vn[items], vn[neg])


def squared(un: torch.Tensor, dot_pos: torch.Tensor, dot_neg: torch.Tensor, vn_pos: torch.Tensor,
            vn_neg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|u|^2 - 2 u.v + |v|^2 for each positive (nnz,) and its draws (nnz, c), from the user's
    squared norm at each positive ``un`` (nnz,), the dot products and the items' squared norms."""
    return un - 2 * dot_pos + vn_pos, un[:, None] - 2 * dot_neg + vn_neg


def weighted_hinge(d_pos: torch.Tensor, d_neg: torch.Tensor, valid: torch.Tensor, margin: float,
                   n_items: int) -> torch.Tensor:
    """(nnz,) w_ui * [margin + d(u, i)^2 - min_k d(u, k)^2]_+ per positive from its squared
    distance ``d_pos`` and its draws' ``d_neg`` (nnz, c); ``valid`` (nnz, c) marks the draws that
    are not the user's positives (a positive with none contributes 0)."""
    c = d_neg.shape[1]
    d_neg = torch.where(valid, d_neg, torch.full_like(d_neg, torch.inf))
    with torch.no_grad():  # the rank estimate weighs the hinge; it is not differentiated
        impostors = ((margin + d_pos[:, None] - d_neg > 0) & valid).sum(1)
        weight = torch.log1p(torch.floor(n_items * impostors.to(d_pos.dtype) / c))
    closest = torch.where(valid.any(1), d_neg.min(1).values, d_pos + margin)
    return weight * torch.relu(margin + d_pos - closest)


def covariance_penalty(x: torch.Tensor) -> torch.Tensor:
    """(|C|_F^2 - |diag C|^2) / rows, C the covariance of the rows of ``x`` (the paper's eq. 7)."""
    centred = x - x.mean(0, keepdim=True)
    cov = centred.T @ centred / len(x)
    return (cov.pow(2).sum() - cov.diagonal().pow(2).sum()) / len(x)
