"""What the closed-form models share: a fit on the whole training matrix, and scores that are
sums of rows of a stored matrix (an item-item matrix, or item factors) for the user's input items.

Every such model scores a user from their input row alone, so a user it was not fitted on (a
cold-start user, a new user at serving time) is scored exactly as one it was: the fold-in is the
model itself.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from models.base import Recommender


def row_sums(matrix: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(B, matrix.shape[1]): for each user, the sum of ``matrix``'s rows of their input items,
    i.e. r @ matrix for the binary row r, without forming r."""
    return F.embedding_bag(items, matrix, offsets, mode="sum")


def randomized_svd(matrix, rank: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(U, sigma, Vt) of the top ``rank`` singular triplets (scikit-learn's randomized SVD, Halko
    et al. 2011, with its default power iterations), float64 for the small dense factors."""
    from sklearn.utils.extmath import randomized_svd as svd

    rank = min(rank, min(matrix.shape) - 1) if min(matrix.shape) > 1 else 1
    return svd(matrix.astype(np.float64), n_components=rank, random_state=seed)


def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable; the physical size where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# the share of the available memory a fit may plan to hold: the rest is the process's own
USABLE_MEMORY = 0.8


def check_memory(model: Recommender, need: int, what: str, instead: str) -> None:
    """Refuse, before allocating, a fit whose ``need`` bytes exceed what the machine has."""
    from prepared.errors import UsageError

    have = available_memory()
    if need > USABLE_MEMORY * have:
        raise UsageError(f"{model.name} on {model.n_items:,} items needs {need / 2**30:.1f} GiB for "
                         f"{what}; this machine has {have / 2**30:.1f} GiB available: {instead}")


class ClosedForm(Recommender):
    kind = "closed-form"
