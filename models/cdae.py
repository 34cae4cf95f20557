"""CDAE: the collaborative denoising autoencoder (Wu, DuBois, Zheng and Ester, "Collaborative
Denoising Auto-Encoders for Top-N Recommender Systems", WSDM 2016).

For user u with binary row y (n items):

    corrupt    y~ = y with each item dropped with probability ``dropout``, kept ones scaled by
               1 / (1 - dropout)  (the paper's unbiased drop-out corruption; none when scoring)
    hidden     z = sigmoid(W y~ + V_u + b)        V_u: the user's own input node, (width,)
    output     yhat_j = sigmoid(W'_j . z + b'_j)
    loss       mean over the entries it covers of the log loss -y_j log yhat_j - (1-y_j) log(1-yhat_j)
               + lam * (mean(W^2) + mean(W'^2) + mean(V_batch^2))

The entries covered: the user's positives and ``neg_ratio`` uniform draws per positive that are
not positives (the paper's negative sampling), or, with ``neg_ratio`` 0, the whole row.

Deviations: the L2 term is written as this project's AutoRec writes it (lambda times the mean
square of each matrix; the paper's lambda/2 times squared norms, biases included, differs by a
constant per matrix); Adam on mini-batches of users (the paper: AdaGrad); the hidden and output
nonlinearities are fixed to sigmoid (the paper's variants are not options); scoring folds each user
in (models/peruser.py): V_u is refitted from the user's uncorrupted row by the same loss, every other
parameter frozen.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from models.base import Recommender
from models.batch import Batch, row_ids
from models.hparams import (
    DROPOUT_HELP,
    HP,
    LAM_HELP,
    NEG_RATIO_HELP,
    PAPER_CORRUPTION,
    PAPER_LAMBDAS,
    PAPER_WIDTHS,
    WIDTH_HELP,
)
from models.losses import densify, l2_penalty
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


class CDAE(Recommender):
    name = "cdae"
    per_user = True
    score_in_blocks = False  # a fold-in per call (models/peruser.py), in blocks of its own
    hyperparameters = {
        "width": HP(200, WIDTH_HELP, lo=1, hi=100_000, search={"paper": PAPER_WIDTHS}),
        "lam": HP(1e-2, LAM_HELP, lo=0, hi=1e6, open_hi=True,
                  search={"paper": PAPER_LAMBDAS, "small": [0.001, 0.01]}),
        "dropout": HP(0.5, DROPOUT_HELP, lo=0, hi=1, open_hi=True,
                      search={"paper": PAPER_CORRUPTION, "small": [0.2, 0.5]}),
        # 0: the whole row (every unobserved item a negative), CDAE's alone
        "neg_ratio": HP(5, NEG_RATIO_HELP, lo=0, hi=10_000, why="0 = the whole row"),
    }
    # its rate probed on ml-100k validation (README, "Models"); patience 20: its validation NDCG
    # first climbs to the popularity ranking's (the output biases learn first), dips for several
    # epochs while the user-dependent part starts, then climbs past it: on ml-latest-small from
    # 0.123 at epoch 3 to 0.171 by epoch 56, but patience 5 stopped it at epoch 8 (the former
    # benchmarks/baselines.py: git show 6071794:benchmarks/results/baselines.md)
    trainer = Training.tuned(learning_rate=3e-3, patience=20)

    def __init__(self, n_items: int, n_users: int, width: int, lam: float, dropout: float,
                 neg_ratio: int):
        super().__init__()
        if n_items < 1 or n_users < 1 or width < 1 or lam < 0 or not 0 <= dropout < 1 \
                or neg_ratio < 0:
            raise ValueError(f"need n_items, n_users, width >= 1, neg_ratio >= 0, lam >= 0 and "
                             f"0 <= dropout < 1; got {n_items}, {n_users}, {width}, {neg_ratio}, "
                             f"{lam}, {dropout}")
        self.n_items, self.n_users, self.width = n_items, n_users, width
        self.lam, self.dropout, self.neg_ratio = float(lam), float(dropout), neg_ratio
        self.encoder = nn.EmbeddingBag(n_items, width, mode="sum")
        self.encoder_bias = nn.Parameter(torch.zeros(width))
        self.users = nn.Embedding(n_users, width)
        self.decoder = nn.Linear(width, n_items)
        bound = 1.0 / math.sqrt(n_items)  # as nn.Linear(n_items, width) would start
        nn.init.uniform_(self.encoder.weight, -bound, bound)
        nn.init.zeros_(self.users.weight)

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "n_users": self.n_users, "width": self.width,
                "lam": self.lam, "dropout": self.dropout, "neg_ratio": self.neg_ratio}

    def hidden(self, items: torch.Tensor, offsets: torch.Tensor, user_node: torch.Tensor,
               corrupt: bool) -> torch.Tensor:
        weights = None
        if corrupt and self.dropout > 0:
            keep = torch.rand(len(items), device=items.device) >= self.dropout
            weights = keep.to(torch.float32) / (1 - self.dropout)
        return torch.sigmoid(self.encoder(items, offsets, per_sample_weights=weights)
                             + user_node + self.encoder_bias)

    def draws(self, items: torch.Tensor) -> torch.Tensor | None:
        if self.neg_ratio == 0:
            return None
        return uniform_negatives(len(items), self.neg_ratio, self.n_items, items.device)

    def forward(self, batch: Batch, step=None) -> dict[str, torch.Tensor]:
        items, offsets = batch.train_items, batch.train_offsets
        node = self.users(batch.users)
        z = self.hidden(items, offsets, node, corrupt=self.training)
        w, bias = self.decoder.weight, self.decoder.bias
        neg = self.draws(items)
        if neg is None:
            total, count = whole_row_loss(z, items, offsets, w, bias)
        else:
            keep = (~is_positive(items, offsets, neg, self.n_items)).to(torch.float32)
            total, count = sampled_loss(z, w, bias, row_ids(offsets, len(items)), items, neg,
                                        keep)
        return {"log_loss": total.sum() / count.sum().clamp(min=1),
                "l2": l2_penalty([self.encoder.weight, self.decoder.weight, node], self.lam)}

    def fold_in(self, items: torch.Tensor, offsets: torch.Tensor,
                steps: int = FOLD_STEPS) -> torch.Tensor:
        """(B, width) user nodes fitted to the users' uncorrupted rows (the mean log loss over
        the covered entries + lam * mean(V_u^2)), every other parameter frozen."""
        if not self.neg_ratio:  # the whole row: every output is needed, so dense it is
            return self.fold_block(items, offsets, None, steps)
        return fold_rows(lambda i, o, dots: self.fold_block(i, o, dots, steps), items, offsets,
                         self.neg_ratio, self.width, self.n_items)

    def fold_block(self, items: torch.Tensor, offsets: torch.Tensor, item_dots, steps: int
                   ) -> torch.Tensor:
        b = len(offsets)
        with torch.no_grad():
            base = self.encoder(items, offsets) + self.encoder_bias
            w, bias = self.decoder.weight.detach(), self.decoder.bias.detach()
            if self.neg_ratio:
                neg = hashed_negatives(items, offsets, self.neg_ratio, self.n_items)
                keep = (~is_positive(items, offsets, neg, self.n_items)).to(torch.float32)
                rows = row_ids(offsets, len(items))
                dots = item_dots(w, rows, items, neg)
                bias_pos, bias_neg = bias[items], bias[neg]

        def loss(node: torch.Tensor) -> torch.Tensor:
            z = torch.sigmoid(base + node)
            if self.neg_ratio:
                pos, negl = dots(z)
                total, count = sampled_terms(pos + bias_pos, negl + bias_neg, rows, keep, b)
            else:
                total, count = whole_row_loss(z, items, offsets, w, bias)
            return total / count.clamp(min=1) + self.lam * node.pow(2).mean(1)

        return fold_in(loss, b, self.width, items.device, steps)

    def score_users(self, node: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor
                    ) -> torch.Tensor:
        """(B, n_items) scores of users with these input nodes (B, width) and uncorrupted rows:
        ``score`` after its fold-in, or a training user's trained node (benchmarks/fold_in.py
        compares the two)."""
        return self.decoder(self.hidden(items, offsets, node, corrupt=False))

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.score_users(self.fold_in(items, offsets), items, offsets)


def sampled_loss(z: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, rows: torch.Tensor,
                 items: torch.Tensor, neg: torch.Tensor, keep: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user sums of the log loss over positives and kept draws, and their counts, each (B,):
    ``z`` (B, width) the users' hidden layers, ``w`` (n_items, width) and ``bias`` the output
    layer's, ``rows``/``items`` (nnz,) each positive's user and item, ``neg`` (nnz, c) its draws,
    ``keep`` (nnz, c) 1 for a draw that is not a positive. Only the outputs it covers are computed
    (``pair_dots``), the whole (B, n_items) output layer only where that is cheaper."""
    pos, negl = pair_dots(z, w, rows, items, neg)
    return sampled_terms(pos + bias[items], negl + bias[neg], rows, keep, len(z))


def sampled_terms(pos: torch.Tensor, negl: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor,
                  b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sampled_loss`` from the logits of each positive (nnz,) and of its draws (nnz, c)."""
    loss = F.softplus(-pos) + (F.softplus(negl) * keep).sum(1)   # -log s(y), -log(1 - s(y))
    total = torch.zeros(b, device=pos.device).index_add_(0, rows, loss)
    count = torch.zeros(b, device=pos.device).index_add_(0, rows, 1 + keep.sum(1))
    return total, count


def whole_row_loss(z: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor, w: torch.Tensor,
                   bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-user sums of the log loss over every item, and the counts (n_items each)."""
    target = densify(items, offsets, None, w.shape[0])
    loss = F.binary_cross_entropy_with_logits(F.linear(z, w, bias), target, reduction="none")
    return loss.sum(1), torch.full((len(z),), float(w.shape[0]), device=z.device)
