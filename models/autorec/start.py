"""``--start-from svd``: the AutoRec family started at its linear closed form (extension beyond the
paper, issue 57; the paper starts from random weights).

The encoder is set to the top ``width`` right singular vectors of the encoder's target, scaled as
NCE-PLRec scales them (V = Q diag(sqrt(sigma)); R* for NCE-AutoRec, R for AutoRec), so that a
user's code before the ReLU is her projected row r V; each head is then the ridge regression of
its own target (R for the predict head, R* for the NCE head) on those codes, at the model's own
L2 (lam * omega * mean(W^2), in the summed form N lam omega / d ||W||^2, as ``ridge`` solves it),
with no intercept. The ReLU is kept out of the way by the encoder's bias: each code dimension is
shifted by the most negative value it takes over the training rows (c_k), and each head's bias
takes the shift back (b = -c Y), so that on every training user

    head(ReLU(r V + c)) = (r V + c) Y - c Y = r V Y

and epoch 0 *is* PLRec (AutoRec) or NCE-PLRec (NCE-AutoRec) at lambda = N lam omega / d: the
same scores as ``models.nce_plrec.NCEPLRec`` of rank ``width`` at that lambda, up to float32
rounding (tests/models/test_svd_start.py). A row whose projection falls below a shift (a user
outside the training rows with an unusual row) is clipped by the ReLU there: the start is exact on
the rows it was solved on. With --pos-weight > 0 the heads are the unweighted solution (the
weighted normal equations differ per item), a start rather than the optimum.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from models.closed_form import randomized_svd


def projection(target: sp.spmatrix, width: int, seed: int) -> np.ndarray:
    """(n_items, width) float64: V = Q diag(sqrt(sigma)) of ``target``'s randomized SVD at rank
    ``width`` (NCE-PLRec's item projection); columns past the matrix's rank are zero."""
    k = min(width, *target.shape)
    _, sigma, qt = randomized_svd(target, k, seed)
    v = np.zeros((target.shape[1], width))
    v[:, :qt.shape[0]] = qt.T * np.sqrt(sigma)
    return v


def ridge_no_intercept(codes: np.ndarray, target: sp.spmatrix, lam: float) -> np.ndarray:
    """(d, n_items) float64: Y = (H'H + lam I)^-1 H' T, NCE-PLRec's regression of ``target`` T on
    the codes H."""
    gram = codes.T @ codes + lam * np.eye(codes.shape[1])
    return np.linalg.solve(gram, np.asarray((target.T @ codes).T))


@torch.no_grad()
def svd_start(model, train: sp.spmatrix, rstar: sp.spmatrix | None, seed: int) -> str:
    """Set ``model`` (an AutoRec-family model with MSE heads) to its linear closed form on the
    binary training rows ``train`` (and ``rstar``, their R* values, for an NCE head); returns a
    line for the run's log."""
    heads = dict(model.heads)
    if "ns" in heads:
        raise ValueError(f"{model.name}: the NS head has no closed form to start from")
    if "nce" in heads and rstar is None:
        raise ValueError(f"{model.name}: an SVD start needs R* (the NCE head's target)")
    train = sp.csr_matrix(train, dtype=np.float64)
    users, width = train.shape[0], model.width
    encoder_target = sp.csr_matrix(rstar, dtype=np.float64) if "nce" in heads else train
    v = projection(encoder_target, width, seed)
    codes = np.asarray(train @ v)                                   # r V, (users, width)
    shift = np.maximum(0.0, -codes.min(axis=0)) if users else np.zeros(width)
    lam = users * model.lam * model.lam_scale / width               # ridge.solve's penalty
    targets = {"predict": train,
               "nce": None if rstar is None
               else sp.csr_matrix(rstar, dtype=np.float64) * model.rstar_unit}
    ys = {name: ridge_no_intercept(codes, targets[name], lam) for name in heads}
    # The scores are the same for the encoder times s and the heads divided by s (the ReLU is
    # positively homogeneous; the shift scales with the codes); the s that minimises the model's
    # L2 over those matrices (s^2 mean(V^2) + sum of mean(Y^2) / s^2) balances their norms, so
    # that the first steps do not spend themselves trading scale between the layers.
    v_norm = np.linalg.norm(v)
    s = (sum(np.linalg.norm(y) ** 2 for y in ys.values()) / v_norm ** 2) ** 0.25 if v_norm else 1.0
    model.encoder.weight.copy_(torch.from_numpy(v * s))
    model.encoder_bias.copy_(torch.from_numpy(shift * s))
    for name, head in heads.items():
        head.weight.copy_(torch.from_numpy(ys[name].T / s))
        head.bias.copy_(torch.from_numpy(-(shift @ ys[name])))
    source = "R*" if "nce" in heads else "R"
    return (f"--start-from svd: encoder from the top {width} singular vectors of {source}, heads "
            f"({', '.join(heads)}) from their ridge solution at lambda {lam:.4g} "
            f"({users:,} users): epoch 0 is {'NCE-PLRec' if 'nce' in heads else 'PLRec'}")
