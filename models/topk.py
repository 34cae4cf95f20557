"""``torch.topk(scores, k, dim=1)`` of a CPU score block, without ranking every score.

On a CPU, torch.topk copies each row into (value, index) pairs and ranks all of them: at the Yahoo
shape (44,865 items, top 50, one thread) that took 150-200 us a user, most of the product that
made the scores. Here a row's items go in groups (item j in group j mod G, ``ITEMS_PER_GROUP``
items each: a maximum over them is one vectorised pass over the block), and only the items of the
k + 1 groups with the largest maxima (plus the fewer than ``ITEMS_PER_GROUP`` items in no group)
are ranked: (k + 1) x 64 scores a row instead of all of them, gathered densely. 64 per group keeps
both rankings cheap: G maxima, and candidates enough for torch.topk's partial sort (which it uses
for at least 64 k values, an order of magnitude cheaper a value than its other path).

Why that is the top k: let t be the (k + 1)-th largest group maximum. Every score above t lies in
a group whose maximum is above t, i.e. one of the k + 1 picked. So if the candidates' k + 1 best
are strictly decreasing (and finite), the k-th of them is above the (k + 1)-th, which is at least
t (the k + 1 picked maxima are candidates): every score at least the k-th lies among the
candidates, and the k best are unique, items and order, so torch.topk gives the same. A row where
that check fails (a tie among its k + 1 best, the -inf of excluded items reaching them, a NaN,
which the maximum carries into its group and torch.topk ranks first) is ranked by torch.topk
itself on its whole row, so ties are broken exactly as before.
"""

from __future__ import annotations

import torch

ITEMS_PER_GROUP = 64
MIN_GROUPS_PER_K = 4  # fewer groups than 4 (k + 1): ranking all scores costs about as much


def top_k(scores: torch.Tensor, k: int) -> torch.return_types.topk:
    """``torch.topk(scores, k, dim=1)`` (largest, sorted) of a 2-D ``scores``, same values and
    indices; by the group maxima on a CPU block of at least ``MIN_GROUPS_PER_K`` (k + 1) groups."""
    rows, n = scores.shape
    per = ITEMS_PER_GROUP
    groups = n // per
    if scores.device.type != "cpu" or k < 1 or groups < MIN_GROUPS_PER_K * (k + 1) or rows == 0:
        return torch.topk(scores, k, dim=1)
    body = groups * per                              # items from body on join no group
    maxima = scores[:, :body].view(rows, per, groups).amax(dim=1)  # group g: g, g + G, ...
    picked = torch.topk(maxima, k + 1, dim=1).indices
    cols = (picked.unsqueeze(2) + groups * torch.arange(per)).view(rows, -1)
    if body < n:  # the items in no group are always candidates
        cols = torch.cat([cols, torch.arange(body, n).expand(rows, -1)], dim=1)
    best = torch.topk(scores.gather(1, cols), k + 1, dim=1)
    values, indices = best.values[:, :k], cols.gather(1, best.indices[:, :k])
    unique = (torch.isfinite(values).all(dim=1)
              & (best.values[:, :-1] > best.values[:, 1:]).all(dim=1))
    redo = (~unique).nonzero(as_tuple=True)[0]
    if len(redo):
        again = torch.topk(scores[redo], k, dim=1)
        values[redo], indices[redo] = again.values, again.indices
    return torch.return_types.topk((values, indices))
