"""EASE (Steck, "Embarrassingly Shallow Autoencoders for Sparse Data", WWW 2019). Not in the
paper; the strongest simple baseline in recent comparisons, so a comparison without it flatters.

    P = (X^T X + lambda I)^-1,   B = I - P diag(1 / diag(P))   (so diag(B) = 0),   scores = x B

X is the binary training matrix. The state is the dense n_items x n_items matrix B: the fit needs
about three such matrices in float64 and refuses, before allocating, a catalogue whose matrices
would not fit in memory, with the size they would need. Unseen users fold in (x B).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from models.closed_form import ClosedForm, check_memory, row_sums
from models.hparams import HP, LAM_HELP, PAPER_LAMBDAS
from models.training import Training

INSTEAD = "use a model with a low-rank state (puresvd, nce-plrec) or a machine with more memory"


class EASETraining(Training):
    """A fit whose peak is its dense float64 item-by-item state: the experiment runs no more EASE
    fits at once than memory holds."""

    @classmethod
    def fit_memory(cls, n_items: int) -> int:
        return fit_bytes(n_items)


class EASE(ClosedForm):
    name = "ease"
    trainer = EASETraining
    hyperparameters = {
        "lam": HP(500.0, LAM_HELP, lo=0, open_lo=True, hi=1e6, open_hi=True,
                  why="the diagonal added to the item Gram matrix",
                  search={"paper": PAPER_LAMBDAS, "small": [100.0, 500.0, 2000.0]}),
    }

    def __init__(self, n_items: int, lam: float):
        super().__init__()
        if n_items < 1 or lam <= 0:
            raise ValueError(f"need n_items >= 1 and lam > 0; got {n_items}, {lam}")
        self.n_items, self.lam = n_items, float(lam)
        # holding B is what scoring needs (Spark executors build the model to load it); the
        # fit's float64 matrices are checked by fit alone, or scoring would refuse a model that
        # the same machine can serve (citeulike-a: 1.1 GiB held, 7.5 GiB to fit)
        check_memory(self, 4 * n_items * n_items, "its n x n weights B (float32)", INSTEAD)
        self.register_buffer("weights", torch.zeros(n_items, n_items))

    def model_args(self) -> dict:
        return {"n_items": self.n_items, "lam": self.lam}

    def fit(self, train, rstar=None, seed: int = 0) -> dict:
        check_memory(self, fit_bytes(self.n_items), "fitting its n x n matrices (float64: the "
                     "Gram matrix, its inverse and B)", INSTEAD)
        t0 = time.perf_counter()
        gram = np.asarray((train.T @ train).todense(), dtype=np.float64)
        gram[np.diag_indices_from(gram)] += self.lam
        p = np.linalg.inv(gram)
        del gram
        b = p / -np.diag(p)
        b[np.diag_indices_from(b)] = 0.0
        self.weights.copy_(torch.from_numpy(b.astype(np.float32)))
        return {"fit_seconds": time.perf_counter() - t0}

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return row_sums(self.weights, items, offsets)


def fit_bytes(n_items: int) -> int:
    """Peak bytes of a fit: three n x n float64 matrices (Gram, inverse, B) plus B in float32."""
    return n_items * n_items * (3 * 8 + 4)
