"""BPR: Bayesian personalised ranking with matrix factorisation (Rendle, Freudenthaler, Gantner and
Schmidt-Thieme, "BPR: Bayesian Personalized Ranking from Implicit Feedback", UAI 2009).

    x_ui = u_u . v_i          (no biases, as the paper's BPR-MF)
    loss = mean over triples (u, i, j) of -log sigmoid(x_ui - x_uj)
           + lam * mean over triples of (|u_u|^2 + |v_i|^2 + |v_j|^2)

An epoch visits every training positive (u, i) once (a batch holds whole users) with ``neg_ratio``
negatives j each, drawn uniformly from the catalogue; a draw that is one of u's positives is dropped
(the paper samples j from I \\ I_u). The regulariser is the paper's per-update one: each triple
regularises the vectors it touches.

Deviations: Adam on mini-batches of users instead of the paper's SGD on single bootstrap-sampled
triples (the trainer is the same for every model); scoring folds each user in (models/peruser.py):
the user's vector is refitted from their row by the same per-user loss, items frozen, so an unseen
user is served like a known one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Recommender
from models.batch import Batch, row_ids
from models.hparams import HP, LAM_HELP, NEG_RATIO_HELP, PAPER_LAMBDAS, PAPER_WIDTHS, WIDTH_HELP
from models.peruser import (
    FOLD_STEPS,
    fold_in,
    fold_rows,
    hashed_negatives,
    is_positive,
    pair_dots,
    uniform_negatives,
)
from models.product import product
from models.training import Training


class BPR(Recommender):
    name = "bpr"
    per_user = True
    score_in_blocks = False  # a fold-in per call (models/peruser.py), in blocks of its own
    hyperparameters = {
        "width": HP(64, WIDTH_HELP, lo=1, hi=100_000, search={"paper": PAPER_WIDTHS}),
        "lam": HP(1e-4, LAM_HELP, lo=0, hi=1e6, open_hi=True,
                  search={"paper": PAPER_LAMBDAS, "small": [1e-5, 1e-4, 1e-3]}),
        "neg_ratio": HP(1, NEG_RATIO_HELP, lo=1, hi=10_000, why="0, the whole row, is cdae's"),
    }
    trainer = Training.tuned(learning_rate=1e-2)  # probed on ml-100k validation (README, "Models")

    def __init__(self, n_items: int, n_users: int, width: int, lam: float, neg_ratio: int):
        super().__init__()
        if n_items < 1 or n_users < 1 or width < 1 or lam < 0 or neg_ratio < 1:
            raise ValueError(f"need n_items, n_users, width, neg_ratio >= 1 and lam >= 0; got "
                             f"{n_items}, {n_users}, {width}, {neg_ratio}, {lam}")
        self.n_items, self.n_users, self.width = n_items, n_users, width
        self.lam, self.neg_ratio = float(lam), neg_ratio
        self.users = nn.Embedding(n_users, width)
        self.items = nn.Embedding(n_items, width)
        nn.init.normal_(self.users.weight, std=0.1)
        nn.init.normal_(self.items.weight, std=0.1)

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "n_users": self.n_users, "width": self.width,
                "lam": self.lam, "neg_ratio": self.neg_ratio}

    def forward(self, batch: Batch, step=None) -> dict[str, torch.Tensor]:
        items, offsets = batch.train_items, batch.train_offsets
        neg = uniform_negatives(len(items), self.neg_ratio, self.n_items, items.device)
        keep = (~is_positive(items, offsets, neg, self.n_items)).to(torch.float32)
        rows = row_ids(offsets, len(items))
        u, v = self.users(batch.users), self.items.weight
        x_ui, x_uj = pair_dots(u, v, rows, items, neg)
        pairs = keep.sum().clamp(min=1)
        vn = v.pow(2).sum(1)
        norms = u.pow(2).sum(1)[rows, None] + vn[items, None] + vn[neg]
        return {"bpr": (pair_losses(x_ui, x_uj) * keep).sum() / pairs,
                "l2": self.lam * (norms * keep).sum() / pairs}

    def fold_in(self, items: torch.Tensor, offsets: torch.Tensor,
                steps: int = FOLD_STEPS) -> torch.Tensor:
        """(B, width) user vectors fitted to their rows, items frozen (models/peruser.py): the
        mean BPR loss over the row's triples + lam |u|^2, the training objective restricted to u."""
        draws = max(self.neg_ratio, 4)
        return fold_rows(lambda i, o, dots: self.fold_block(i, o, dots, draws, steps), items,
                         offsets, draws, self.width, self.n_items)

    def fold_block(self, items: torch.Tensor, offsets: torch.Tensor, item_dots, draws: int,
                   steps: int) -> torch.Tensor:
        neg = hashed_negatives(items, offsets, draws, self.n_items)
        keep = (~is_positive(items, offsets, neg, self.n_items)).to(torch.float32)
        rows, b = row_ids(offsets, len(items)), len(offsets)
        dots = item_dots(self.items.weight.detach(), rows, items, neg)
        n = torch.zeros(b, device=items.device).index_add_(0, rows, keep.sum(1)).clamp(min=1)

        def loss(u: torch.Tensor) -> torch.Tensor:
            per = (pair_losses(*dots(u)) * keep).sum(1)
            return (torch.zeros(b, device=u.device).index_add_(0, rows, per) / n
                    + self.lam * u.pow(2).sum(1))

        return fold_in(loss, b, self.width, items.device, steps)

    def score_users(self, u: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor
                    ) -> torch.Tensor:
        """(B, n_items) scores of users with these vectors (B, width): ``score`` after its
        fold-in, or a training user's trained vector (benchmarks/fold_in.py compares the two)."""
        return product(u, self.items.weight.T)

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.score_users(self.fold_in(items, offsets), items, offsets)

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor):
        return self.fold_in(items, offsets), self.items.weight.T, None



def pair_losses(x_ui: torch.Tensor, x_uj: torch.Tensor) -> torch.Tensor:
    """(nnz, c) -log sigmoid(x_ui - x_uj) from each positive's score (nnz,) and its draws' (nnz, c)."""
    return F.softplus(x_uj - x_ui[:, None])
