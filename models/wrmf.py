"""WRMF: weighted matrix factorisation for implicit feedback (Hu, Koren, Volinsky, ICDM 2008),
fitted by Spark MLlib's ALS (``implicitPrefs=True``), the distributed engine for this model.

    minimise  sum_{u,i} c_ui (p_ui - x_u^T y_i)^2 + lambda (sum_u n_u |x_u|^2 + sum_i n_i |y_i|^2)
    p_ui = 1 for a training positive, else 0;   c_ui = 1 + alpha * p_ui

The n_u, n_i (positives per user, per item) are Spark's scaling of the regularisation ("ALS-WR",
Zhou et al. 2008; MLlib scales regParam so since 1.1): ``--lam`` means what it means to Spark, not
the unscaled lambda of the paper or of the ``implicit`` package. We keep the item factors Y only:
a user, seen or not, is scored by the fold-in least-squares solve against Y, which is exactly
ALS's own user step,

    x_u = (Y^T Y + alpha Y_u^T Y_u + lambda n_u I)^-1 (1 + alpha) Y_u^T 1,   scores = Y x_u,

(Y_u: the factors of u's input items), so training users get the factors one more ALS half-step
would give them and cold-start users fold in the same way.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from models.closed_form import ClosedForm
from models.hparams import HP, LAM_HELP, PAPER_LAMBDAS, PAPER_WIDTHS, RANK_HELP

FOLD_IN_USERS = 256  # users solved at once: a (users x longest row x rank) gather stays small


class WRMF(ClosedForm):
    name = "wrmf"
    score_in_blocks = False  # each call builds the (rank, rank) Gram of every item factor first
    engine = "spark"
    # defaults: validation's choice on ml-100k and ml-latest-small (the former
    # benchmarks/baselines.py; git show 6071794:benchmarks/results/baselines.md). The paper's
    # negative alphas would weigh positives below the unobserved entries (confidence 1 + alpha):
    # only 0..100 are searched
    hyperparameters = {
        "rank": HP(50, RANK_HELP, lo=1, hi=100_000, search={"paper": PAPER_WIDTHS, "small": [50]}),
        "lam": HP(0.1, LAM_HELP, lo=0, hi=1e6, open_hi=True,
                  search={"paper": PAPER_LAMBDAS, "small": [0.1, 1.0]}),
        "alpha": HP(5.0, "confidence 1 + alpha of a positive", lo=0, hi=1e6,
                    search={"paper": [0.0, 0.1, 1.0, 10.0, 100.0], "small": [1.0, 5.0]}),
        "iterations": HP(15, "ALS sweeps", lo=1, hi=10_000),
    }

    def __init__(self, n_items: int, rank: int, lam: float, alpha: float, iterations: int):
        super().__init__()
        if n_items < 1 or rank < 1 or lam < 0 or alpha < 0 or iterations < 1:
            raise ValueError(f"need n_items, rank, iterations >= 1 and lam, alpha >= 0; got "
                             f"{n_items}, {rank}, {iterations}, {lam}, {alpha}")
        self.n_items, self.rank, self.lam = n_items, rank, float(lam)
        self.alpha, self.iterations = float(alpha), iterations
        self.register_buffer("item_factors", torch.zeros(n_items, rank))

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "rank": self.rank, "lam": self.lam, "alpha": self.alpha,
                "iterations": self.iterations}

    def fit(self, train, rstar=None, seed: int = 0) -> dict:
        """``train``: a Spark DataFrame of (user_index int, item_index int) training positives."""
        from pyspark.ml.recommendation import ALS
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        als = ALS(rank=self.rank, maxIter=self.iterations, regParam=self.lam, alpha=self.alpha,
                  implicitPrefs=True, userCol="user_index", itemCol="item_index",
                  ratingCol="rating", seed=seed, nonnegative=False, checkpointInterval=-1)
        fitted = als.fit(train.withColumn("rating", F.lit(1.0).cast("float")))
        factors = fitted.itemFactors.toPandas()  # n_items x rank: small enough for the driver
        y = torch.zeros(self.n_items, self.rank)
        if len(factors):
            ids = torch.as_tensor(factors["id"].to_numpy(), dtype=torch.int64)
            y[ids] = torch.from_numpy(np.stack(factors["features"].to_numpy()).astype(np.float32))
        self.item_factors.copy_(y)
        return {"als_seconds": time.perf_counter() - t0}

    def user_factors(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """(B, rank) fold-in solves (float64 for the k x k systems), ``FOLD_IN_USERS`` at a time."""
        y = self.item_factors.double()
        gram = y.T @ y
        eye = torch.eye(self.rank, dtype=torch.float64)
        lengths = torch.diff(offsets, append=torch.tensor([len(items)]))
        out = []
        for lo in range(0, len(offsets), FOLD_IN_USERS):
            n = lengths[lo:lo + FOLD_IN_USERS]
            start = int(offsets[lo]) if len(offsets) else 0
            # each user's item factors, zero-padded to the longest row of the chunk
            longest = int(n.max()) if len(n) else 0
            pad = torch.zeros(len(n), max(longest, 1), self.rank, dtype=torch.float64)
            rows = torch.repeat_interleave(torch.arange(len(n)), n)
            cols = torch.arange(int(n.sum())) - torch.repeat_interleave(
                torch.cumsum(n, 0) - n, n)
            pad[rows, cols] = y[items[start:start + int(n.sum())]]
            # lambda n_u I makes A positive definite for a user with items; a user without any
            # has b = 0, and the identity added for them gives x = 0 whatever Y is
            ridge = torch.where(n > 0, self.lam * n.double(), torch.ones(len(n), dtype=torch.float64))
            a = gram + self.alpha * pad.transpose(1, 2) @ pad + ridge[:, None, None] * eye
            b = (1.0 + self.alpha) * pad.sum(dim=1)
            out.append(torch.linalg.solve(a, b))
        return torch.cat(out).float() if out else torch.zeros(0, self.rank)

    def score_factors(self, items: torch.Tensor, offsets: torch.Tensor):
        return self.user_factors(items, offsets), self.item_factors.T, None
