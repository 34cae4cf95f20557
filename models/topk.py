"""``torch.topk(scores, k, dim=1)`` of a CPU score block, without ranking every score.

On a CPU, torch.topk copies each row into (value, index) pairs and ranks all of them: at the Yahoo
shape (44,865 items, top 50, one thread) that took 150-200 us a user, most of the product that
made the scores. Here a row's n items go in G groups of g items (item j in group j mod G: a
maximum over them is one vectorised pass over the block), and only the items of the k + 1 groups
with the largest maxima (plus the fewer than g items in no group) are ranked, gathered densely.

The group size (``group_size``): the maxima read every score whatever g is, so what g changes is
the two rankings, of the G = n / g maxima and of the (k + 1) g candidates. Their cost, about
n / g + (k + 1) g, is least where its derivative -n / g^2 + (k + 1) is zero: g = sqrt(n / (k + 1)),
G = sqrt(n (k + 1)) groups, both rankings then sqrt(n (k + 1)) values. At the Yahoo shape that is
g = 30 (1,495 groups, 1,530 candidates) where the earlier fixed 64 gave 701 and 3,264: measured
at 97-107 us a user against 159-163 us with groups of 64 (one thread). Both rankings pick
k + 1, so each costs about its length. A block of fewer than ``MIN_GROUPS_PER_K`` (k + 1) groups,
i.e. g < 4 (roughly n < 16 (k + 1)), is ranked whole: there the two rankings together are no
cheaper than one.

Why that is the top k: let t be the (k + 1)-th largest group maximum. Every score above t lies in
a group whose maximum is above t, i.e. one of the k + 1 picked. So if the candidates' k + 1 best
are strictly decreasing (and finite), the k-th of them is above the (k + 1)-th, which is at least
t (the k + 1 picked maxima are candidates): every score at least the k-th lies among the
candidates, and the k best are unique, items and order, so torch.topk gives the same. A row where
that check fails (a tie among its k + 1 best, the -inf of excluded items reaching them, a NaN,
which the maximum carries into its group and torch.topk ranks first) is ranked by torch.topk
itself on its whole row, so ties are broken exactly as before. None of this depends on g.
"""

from __future__ import annotations

import math

import torch

MIN_GROUPS_PER_K = 4  # fewer groups than 4 (k + 1): ranking all scores costs about as much


def group_size(n: int, k: int) -> int:
    """Items per group for ``n`` items and top ``k``: sqrt(n / (k + 1)) rounded (at least 1),
    which makes the G maxima and the (k + 1) g candidates equally many (see the module's doc)."""
    return max(1, round(math.sqrt(n / (k + 1))))


def top_k(scores: torch.Tensor, k: int) -> torch.return_types.topk:
    """``torch.topk(scores, k, dim=1)`` (largest, sorted) of a 2-D ``scores``, same values and
    indices; by the group maxima on a CPU block of at least ``MIN_GROUPS_PER_K`` (k + 1) groups."""
    rows, n = scores.shape
    if scores.device.type != "cpu" or k < 1 or rows == 0:
        return torch.topk(scores, k, dim=1)
    per = group_size(n, k)
    groups = n // per
    if groups < MIN_GROUPS_PER_K * (k + 1):
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
