"""EASE (Steck, "Embarrassingly Shallow Autoencoders for Sparse Data", WWW 2019). Not in the
paper; the strongest simple baseline in recent comparisons, so a comparison without it flatters.

    P = (X^T X + lambda I)^-1,   B = I - P diag(1 / diag(P))   (so diag(B) = 0),   scores = x B

X is the binary training matrix. The state is the dense n_items x n_items matrix B. The fit works
in one dense matrix: the Gram matrix becomes its Cholesky factor, then P, then B
(``ease_weights``), so its peak is two n x n matrices (LAPACK's column-major copy inside each
call) plus the sparse Gram. It solves in float64 where that and B's float32 copy fit in memory
(every result before issue 57 was fitted so), else in float32 (Gowalla's 40,981 items: 12.5 GiB
instead of 31; float32 keeps B to about 1e-5 of its float64 value,
tests/training/test_closed_form.py). A catalogue that fits neither way is refused before
allocating, with the size it would need. Unseen users fold in (x B).
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
    """A fit whose peak is its dense item-by-item state: the experiment runs no more EASE fits at
    once than memory holds."""

    @classmethod
    def fit_memory(cls, n_items: int) -> int:
        # as ``fit`` will choose: float64 where one such fit fits in memory
        return fit_bytes(n_items, fit_dtype(n_items, 0) or np.float64)


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
        # the unfitted zeros go first: the fit replaces them, and held they would take B's size
        # (6.3 GiB on Gowalla) from what the fit may use
        self.weights = torch.zeros(0, 0)
        sparse = sparse_gram_bytes(train)
        dtype = fit_dtype(self.n_items, sparse)
        if dtype is None:
            check_memory(self, fit_bytes(self.n_items, np.float32) + sparse,
                         "fitting its n x n matrix (float32: the Gram matrix, then P, then B, "
                         "and LAPACK's copy) and the sparse Gram matrix", INSTEAD)
        t0 = time.perf_counter()
        b = ease_weights(train, self.lam, dtype)
        # the float32 solve's array becomes the state as it is: no second n x n copy
        self.weights = torch.from_numpy(b if b.dtype == np.float32 else b.astype(np.float32))
        return {"fit_seconds": time.perf_counter() - t0, "fit_dtype": np.dtype(dtype).name}

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return row_sums(self.weights, items, offsets)


def fit_bytes(n_items: int, dtype=np.float64) -> int:
    """Peak bytes of a fit's dense matrices: the n x n matrix solved in place, the column-major
    copy LAPACK's Cholesky and inverse each make of it, and in float64 B's float32 copy."""
    size = np.dtype(dtype).itemsize
    return n_items * n_items * (2 * size + (4 if size != 4 else 0))


def sparse_gram_bytes(train) -> int:
    """A bound on the sparse X'X's bytes (index and value per entry): its non-zeros are at most
    n^2 and at most sum_u n_u^2."""
    per_user = np.diff(train.indptr).astype(np.int64)
    n = train.shape[1]
    return 12 * int(min(n * n, (per_user * per_user).sum()))


def fit_dtype(n_items: int, sparse_bytes: int):
    """float64 where its fit fits in memory, else float32 where that fits, else None."""
    from models.closed_form import USABLE_MEMORY, available_memory

    have = USABLE_MEMORY * available_memory()
    for dtype in (np.float64, np.float32):
        if fit_bytes(n_items, dtype) + sparse_bytes <= have:
            return dtype
    return None


def ease_weights(train, lam: float, dtype=np.float64) -> np.ndarray:
    """B = I - P diag(1 / diag(P)), P = (X'X + lam I)^-1, in ``dtype``, computed in one dense
    (n, n) array, which is returned: the Gram matrix becomes its Cholesky factor, then P
    (torch's LAPACK calls with ``out=`` the same array). scipy's LAPACK wrappers would overwrite
    without a copy, but its bundled OpenBLAS's spotrf crashed (SIGSEGV) at Gowalla's 40,981
    items; torch's (MKL) took 107 s and 242 s there on 2 cores, peaking at 14 GiB."""
    gram = (train.T @ train).astype(dtype).toarray(order="C")  # X'X symmetric
    gram[np.diag_indices_from(gram)] += lam
    a = torch.from_numpy(gram)
    _, info = torch.linalg.cholesky_ex(a, out=(a, torch.empty((), dtype=torch.int32)))
    if int(info) != 0:
        raise ValueError(f"ease: X'X + lam I is not positive definite (Cholesky info {int(info)}); "
                         f"lam {lam:g} must be > 0")
    torch.cholesky_inverse(a, out=a)  # the whole symmetric inverse, into the same array
    diag = gram.diagonal().copy()
    np.divide(gram, -diag, out=gram)  # column j over -P_jj
    gram[np.diag_indices_from(gram)] = 0.0
    return gram
