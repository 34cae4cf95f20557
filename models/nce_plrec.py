"""NCE-PLRec (Wu, Volkovs, ... Sanner, the paper's own projected linear model; protocol.md).

    Q, sigma  = randomized SVD of R* (rank k): its right singular vectors and values
    V         = Q diag(sqrt(sigma))                 (n_items x k), the item projection
    RQ        = R V                                 (users x k), users' projected rows
    Y         = (RQ^T RQ + lambda I)^-1 RQ^T R      (k x n_items), a ridge regression back to R
    scores    = (r V) Y

R* is the closed-form NCE target on the observed training entries (protocol.md, "NCE target"),
with the run's beta and Z rule; R is binary. A user's projection depends on their row alone, so
unseen users fold in. As in the authors' code (wuga214/NCE_Projected_LRec), the regression is
solved in closed form on the k x k system and lambda is not scaled by the number of users.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from models.base import RSTAR
from models.closed_form import ClosedForm, randomized_svd, row_sums
from models.hparams import HP, LAM_HELP, PAPER_BETAS, PAPER_LAMBDAS, PAPER_WIDTHS, RANK_HELP


class NCEPLRec(ClosedForm):
    name = "nce-plrec"
    hyperparameters = {  # defaults: validation's choice on ml-latest-small (the former
        # benchmarks/baselines.py; its table: git show 6071794:benchmarks/results/baselines.md)
        "rank": HP(200, RANK_HELP, lo=1, hi=100_000,
                   search={"paper": PAPER_WIDTHS, "small": [100, 200]}),
        "lam": HP(10000.0, LAM_HELP, lo=0, hi=1e6, open_hi=True,
                  search={"paper": PAPER_LAMBDAS, "small": [1000.0, 10000.0]}),
    }
    run_axes = {"paper": {"beta": PAPER_BETAS}, "small": {"beta": [0.8, 1.0]}}
    needs = frozenset({RSTAR})

    def __init__(self, n_items: int, rank: int, lam: float):
        super().__init__()
        if n_items < 1 or rank < 1 or lam < 0:
            raise ValueError(f"need n_items >= 1, rank >= 1, lam >= 0; got {n_items}, {rank}, {lam}")
        self.n_items, self.rank, self.lam = n_items, rank, float(lam)
        self.register_buffer("projection", torch.zeros(n_items, rank))   # V
        self.register_buffer("regression", torch.zeros(rank, n_items))   # Y

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "rank": self.rank, "lam": self.lam}

    def fit(self, train, rstar=None, seed: int = 0) -> dict:
        if rstar is None:
            raise ValueError("nce-plrec fits on R*: pass the R* matrix of the training entries")
        t0 = time.perf_counter()
        _, sigma, qt = randomized_svd(rstar, self.rank, seed)
        v = qt.T * np.sqrt(sigma)                       # (n, k') float64
        rq = np.asarray(train @ v)                      # (m, k')
        gram = rq.T @ rq + self.lam * np.eye(v.shape[1])
        y = np.linalg.solve(gram, np.asarray((train.T @ rq).T))   # (k', n) = gram^-1 RQ^T R
        k = v.shape[1]
        self.projection.zero_()
        self.regression.zero_()
        self.projection[:, :k] = torch.from_numpy(v.astype(np.float32))
        self.regression[:k] = torch.from_numpy(y.astype(np.float32))
        return {"fit_seconds": time.perf_counter() - t0}

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor):
        return row_sums(self.projection, items, offsets), self.regression, None
