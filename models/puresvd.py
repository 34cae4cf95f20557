"""PureSVD (Cremonesi, Koren, Turrin, RecSys 2010), as protocol.md defines it.

The top ``rank`` right singular vectors V (n_items x rank) of the binary training matrix R; a user
with row r scores ``r V V^T``, the projection of r on the span of the leading item factors. The
SVD is scikit-learn's randomized SVD, seeded.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from models.closed_form import ClosedForm, randomized_svd, row_sums
from models.hparams import HP, PAPER_WIDTHS, RANK_HELP


class PureSVD(ClosedForm):
    name = "puresvd"
    hyperparameters = {  # the default: validation's choice on ml-latest-small (the former
        # benchmarks/baselines.py; its table: git show 6071794:benchmarks/results/baselines.md)
        "rank": HP(20, RANK_HELP, lo=1, hi=100_000,
                   search={"paper": PAPER_WIDTHS, "small": [20, 50, 100]}),
    }

    def __init__(self, n_items: int, rank: int):
        super().__init__()
        if n_items < 1 or rank < 1:
            raise ValueError(f"need n_items >= 1 and rank >= 1; got {n_items}, {rank}")
        self.n_items, self.rank = n_items, rank
        self.register_buffer("items_factors", torch.zeros(n_items, rank))

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "rank": self.rank}

    def fit(self, train, rstar=None, seed: int = 0) -> dict:
        t0 = time.perf_counter()
        _, _, vt = randomized_svd(train, self.rank, seed)
        v = np.zeros((self.n_items, self.rank), np.float32)
        v[:, :vt.shape[0]] = vt.T  # a matrix of lower rank than asked leaves zero columns
        self.items_factors.copy_(torch.from_numpy(v))
        return {"svd_seconds": time.perf_counter() - t0}

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor):
        return row_sums(self.items_factors, items, offsets), self.items_factors.T, None
