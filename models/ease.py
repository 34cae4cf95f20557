"""EASE (Steck, "Embarrassingly Shallow Autoencoders for Sparse Data", WWW 2019). Not in the
paper; the strongest simple baseline in recent comparisons, so a comparison without it flatters.

    P = (X^T X + lambda I)^-1,   B = I - P diag(1 / diag(P))   (so diag(B) = 0),   scores = x B

X is the binary training matrix. The state is the dense n_items x n_items matrix B. The fit works
in place on one dense matrix: the Gram matrix becomes its Cholesky factor, then P (LAPACK potrf,
potri), then B, so its peak is one n x n matrix plus the sparse Gram. It solves in float64 where
that and B's float32 copy fit in memory (every result before issue 57 was fitted so), else in
float32 (Gowalla's 40,981 items: 6.3 GiB instead of 19; float32 keeps B to about 1e-5 of its
float64 value, tests/training/test_closed_form.py). A catalogue that fits neither way is refused
before allocating, with the size it would need. Unseen users fold in (x B).
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
        dtype = fit_dtype(self.n_items, sparse_gram_bytes(train))
        if dtype is None:
            check_memory(self, fit_bytes(self.n_items, np.float32) + sparse_gram_bytes(train),
                         "fitting its n x n matrix in place (float32: the Gram matrix, then P, "
                         "then B) and the sparse Gram matrix", INSTEAD)
        t0 = time.perf_counter()
        b = ease_weights(train, self.lam, dtype)
        # the float32 solve's array becomes the state as it is: no second n x n copy
        self.weights = torch.from_numpy(b if b.dtype == np.float32 else b.astype(np.float32))
        return {"fit_seconds": time.perf_counter() - t0, "fit_dtype": np.dtype(dtype).name}

    def score(self, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return row_sums(self.weights, items, offsets)


def fit_bytes(n_items: int, dtype=np.float64) -> int:
    """Peak bytes of a fit's dense matrices: the n x n matrix solved in place, and in float64
    B's float32 copy beside it."""
    size = np.dtype(dtype).itemsize
    return n_items * n_items * (size + (4 if size != 4 else 0))


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
    """B = I - P diag(1 / diag(P)), P = (X'X + lam I)^-1, in ``dtype``, computed in place in one
    dense (n, n) array, which is returned."""
    from scipy.linalg import lapack

    gram = (train.T @ train).astype(dtype).toarray(order="C")  # X'X symmetric
    gram[np.diag_indices_from(gram)] += lam
    potrf, potri = ((lapack.spotrf, lapack.spotri) if np.dtype(dtype) == np.float32
                    else (lapack.dpotrf, lapack.dpotri))
    # the transpose of a C-ordered symmetric matrix is itself in Fortran order, which LAPACK
    # overwrites without a copy; its upper triangle is the C array's lower one
    factor, info = potrf(gram.T, lower=0, clean=0, overwrite_a=1)
    if info != 0:
        raise ValueError(f"ease: X'X + lam I is not positive definite (LAPACK potrf info {info}); "
                         f"lam {lam:g} must be > 0")
    inverse, info = potri(factor, lower=0, overwrite_c=1)
    if info != 0 or not np.shares_memory(inverse, gram):
        raise RuntimeError(f"ease: LAPACK potri failed in place (info {info})")
    mirror_lower(gram)
    diag = gram.diagonal().copy()
    np.divide(gram, -diag, out=gram)  # column j over -P_jj
    gram[np.diag_indices_from(gram)] = 0.0
    return gram


def mirror_lower(a: np.ndarray, block: int = 2048) -> None:
    """Copy the lower triangle of the square C-ordered ``a`` onto its upper one, a band of rows
    at a time (the transposed copy of a whole triangle would need another n x n array)."""
    n = a.shape[0]
    for r0 in range(0, n, block):
        r1 = min(r0 + block, n)
        a[r0:r1, r1:] = a[r1:, r0:r1].T
        sq = a[r0:r1, r0:r1]
        upper = np.triu_indices(r1 - r0, 1)
        sq[upper] = sq.T[upper]
