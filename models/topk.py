"""``torch.topk(scores, k, dim=1)`` of a CPU score block, without its pass over every row's pairs.

On a CPU, torch.topk copies each row into (value, index) pairs and partial-sorts all of them: at
the Yahoo shape (44,865 items, top 50) that costs a third of the product that made the scores
(benchmarks/results/score_throughput.md). Here each row first gets a threshold that at least k of
its scores reach: the k-th largest of the maxima of ``GROUPS_PER_K`` x k disjoint groups of its
items (k groups have a maximum at least that large, so the row's k-th largest score is too). Only
the scores at or above it (typically little more than k of them) are gathered and ranked: the
block is read twice from the cache (the group maxima, the comparison) instead of sorted.

The answer is torch.topk's, not just its values: where a row's k + 1 best scores are all distinct
and finite the top k is unique (items and order), so both give it; a row with a tie among them
(equal scores, or the -inf of excluded items where fewer than k + 1 remain, or a NaN) is ranked
by torch.topk itself on its whole row, so ties are broken exactly as before.
"""

from __future__ import annotations

import torch

GROUPS_PER_K = 16   # groups per recommended item: more groups, a threshold nearer the k-th score
MIN_ITEMS_PER_K = 64  # below k x this many items torch.topk's own pass is as cheap (its heuristic)


def top_k(scores: torch.Tensor, k: int) -> torch.return_types.topk:
    """``torch.topk(scores, k, dim=1)`` (largest, sorted) of a 2-D ``scores``, same values and
    indices; the threshold path on a CPU block with at least ``MIN_ITEMS_PER_K`` x k columns."""
    rows, n = scores.shape
    if scores.device.type != "cpu" or k < 1 or n < MIN_ITEMS_PER_K * k or rows == 0:
        return torch.topk(scores, k, dim=1)
    per = n // (GROUPS_PER_K * k)                    # items per group, >= 4
    groups = n // per                                # the last n % per items join no group:
    maxima = scores[:, :groups * per].view(rows, groups, per).amax(dim=2)  # still a lower bound
    threshold = torch.topk(maxima, k, dim=1).values[:, -1:]
    hit = scores >= threshold                        # the candidates, the top k among them
    counts = hit.sum(dim=1)
    width = int(counts.max())
    if width > n // 4:  # a degenerate block (e.g. mostly -inf): the threshold bought nothing
        return torch.topk(scores, k, dim=1)
    row, col = hit.nonzero(as_tuple=True)           # row-major: each row's candidates in order
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(row)) - starts[row]
    cand = torch.full((rows, max(width, k + 1)), -torch.inf, dtype=scores.dtype)
    cand_item = torch.zeros(cand.shape, dtype=torch.long)
    cand[row, slot] = scores[row, col]
    cand_item[row, slot] = col
    best = torch.topk(cand, k + 1, dim=1)
    values, indices = best.values[:, :k], cand_item.gather(1, best.indices[:, :k])
    # unique top k: k + 1 strictly decreasing finite scores (a padding -inf may follow the k-th:
    # then the row had exactly k candidates, all above every other score)
    finite = torch.isfinite(values).all(dim=1)
    distinct = (values[:, :-1] > values[:, 1:]).all(dim=1) & (values[:, -1] > best.values[:, k])
    # a NaN is no candidate (NaN >= t is false) but torch.topk ranks it first: its row is redone
    # (amax carries it into its group's maximum; the items in no group are looked at here)
    nan = maxima.isnan().any(dim=1) | scores[:, groups * per:].isnan().any(dim=1)
    redo = (~(finite & distinct) | nan).nonzero(as_tuple=True)[0]
    if len(redo):
        again = torch.topk(scores[redo], k, dim=1)
        values[redo], indices[redo] = again.values, again.indices
    return torch.return_types.topk((values, indices))
