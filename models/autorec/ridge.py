"""Fine-tune phase 2's start (``--finetune-init ridge``): the predict head that minimises the MSE
objective of ``models.autorec.losses`` on a frozen encoder's codes, solved exactly instead of
trained (deviation from the paper, which starts phase 2's head untrained: Adam from there needs
hundreds of epochs).

Over N users with codes h_u and binary rows r_u, the phase's loss summed over an epoch and scaled
by N n_items is

    sum over users and items of (r_ui - w_i . h_u - b_i)^2 + (N lam / d) ||W||_F^2

(the MSE over the batch's (user, item) entries plus lam * mean(W^2); ``lam`` in plain units, a
model's ``lam * lam_scale``): per item a ridge regression on X = [H, 1] with the bias unpenalised,
(X'X + a D) theta_i = X' r_i for all items at once. ``statistics`` sums X'X and R'X a batch at a
time (training sums them over batches and ranks), ``solve`` is the one solve, and
``reference_head`` the same minimiser from every row at once, by another route to X'R (scipy):
what tests and benchmarks/finetune_convergence.py measure a trained phase 2 against.
"""

from __future__ import annotations

import numpy as np
import torch

from models.batch import flat, row_ids, to_csr
from prepared import schema as S


@torch.no_grad()
def statistics(codes: torch.Tensor, items: torch.Tensor, offsets: torch.Tensor, n_items: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(X'X (d+1, d+1), R'X (n_items, d+1)) in float64 of one batch: X = [codes, 1], R the
    batch's binary rows (EmbeddingBag layout). Sums over batches are what ``solve`` takes."""
    h = codes.double()
    x = torch.cat([h, torch.ones(len(h), 1, dtype=h.dtype, device=h.device)], 1)
    rtx = torch.zeros(n_items, x.shape[1], dtype=x.dtype, device=x.device)
    rtx.index_add_(0, items, x.index_select(0, row_ids(offsets, len(items))))
    return x.T @ x, rtx


@torch.no_grad()
def solve(gram: torch.Tensor, rtx: torch.Tensor, n_users: float, lam: float
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (n_items, d), bias (n_items,)), in ``gram``'s dtype: the minimiser of the objective
    above over the ``n_users`` rows that ``gram`` = X'X and ``rtx`` = R'X sum."""
    d = gram.shape[0] - 1
    penalty = torch.full((d + 1,), n_users * lam / d, dtype=gram.dtype, device=gram.device)
    penalty[d] = 0.0  # the bias is not regularised
    theta = torch.linalg.solve(gram + torch.diag(penalty), rtx.T)  # (d + 1, n_items)
    return theta[:d].T, theta[d]


@torch.no_grad()
def reference_head(model, rows, n_items: int, lam: float, batch: int = 4096
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight (n_items, d), bias (n_items,)) float32: ``solve`` on ``rows``' training items (a
    pyarrow table) and ``model``'s codes (``encode``), all rows at once in float64, X'R through
    scipy rather than ``statistics``' index_add."""
    items, off = flat(rows.column(S.TRAIN_ITEMS))
    t_items, t_off = torch.from_numpy(items.astype(np.int64)), torch.from_numpy(off)
    n_users = rows.num_rows
    codes = torch.cat([model.encode(t_items[t_off[lo]:(t_off[hi] if hi < n_users else None)],
                                    t_off[lo:hi] - t_off[lo]).double()
                       for lo in range(0, n_users, batch) for hi in [min(lo + batch, n_users)]])
    x = torch.cat([codes, torch.ones(n_users, 1, dtype=torch.float64)], 1)  # (N, d + 1)
    r = to_csr(t_items, t_off, n_items).astype(np.float64)
    rtx = torch.from_numpy(np.asarray(r.T @ x.numpy()))  # (n_items, d + 1) = R'X
    weight, bias = solve(x.T @ x, rtx, n_users, lam)
    return weight.float().contiguous(), bias.float().contiguous()
