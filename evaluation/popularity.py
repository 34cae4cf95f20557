"""The personalisation (popularity-bias) analysis of protocol.md, vectorised.

For the users with a test item, pool the popularity (train + valid counts) of every item in their
top-K lists. A model is compared by that distribution (the paper plots its density), its median,
the share of recommendations drawn from the 10% most popular items, catalog coverage (distinct
recommended items / all items) and the Gini index of how often each item is recommended.
"""

from __future__ import annotations

import numpy as np

from prepared.protocol import head_items  # noqa: F401 (part of this module's interface)


def gini(counts: np.ndarray) -> float:
    """Gini index of non-negative ``counts`` (0: every item recommended equally often; -> 1: all
    recommendations on one item). Items never recommended count as zeros."""
    x = np.sort(np.asarray(counts, dtype=np.float64))
    n, total = len(x), x.sum()
    if n == 0 or total == 0:
        return 0.0
    # G = sum_i (2i - n - 1) x_(i) / (n * sum x), i = 1..n over the ascending order
    i = np.arange(1, n + 1)
    return float(((2 * i - n - 1) * x).sum() / (n * total))


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """``np.median(np.repeat(values, weights))`` without materialising the repeat (the pooled list
    of a million users' top-50 is 50M entries; per item it is n_items)."""
    order = np.argsort(values, kind="stable")
    v, cum = np.asarray(values)[order], np.cumsum(np.asarray(weights, np.int64)[order])
    total = int(cum[-1])
    at = lambda pos: v[np.searchsorted(cum, pos, side="right")]  # value at 0-based pooled position
    return float(at(total // 2)) if total % 2 else float((at(total // 2 - 1) + at(total // 2)) / 2)


def summary_from_counts(counts: np.ndarray, popularity: np.ndarray) -> dict[str, float]:
    """The summary of ``popularity_summary`` from how often each item was recommended
    (``counts`` (n_items,)): what a distributed job aggregates to, at most one row per item."""
    counts, popularity = np.asarray(counts, np.int64), np.asarray(popularity)
    total = int(counts.sum())
    if total == 0:
        raise ValueError("no recommendations to analyse (every list is empty)")
    head = np.zeros(len(popularity), bool)
    head[head_items(popularity)] = True
    return {"median_popularity": weighted_median(popularity, counts),
            "mean_popularity": float((popularity * counts).sum() / total),
            "share_top10pct": float(counts[head].sum() / total),
            "coverage": float((counts > 0).sum() / len(popularity)), "gini": gini(counts),
            "recommendations": total}


def popularity_summary(recs: np.ndarray, popularity: np.ndarray) -> dict[str, float]:
    """Summary of (U, K) recommended item indices (-1 pads short lists) against per-item
    ``popularity`` (n_items,). Returns median and mean popularity of the recommended items, the
    share from the 10% most popular items, catalog coverage and the Gini index."""
    recs = np.asarray(recs)
    items = recs[recs >= 0]
    return summary_from_counts(np.bincount(items, minlength=len(popularity)), popularity)
