"""Paired significance tests over users, computed from aggregates so that nothing the size of the
user set reaches the driver (evaluation runs at millions of users): the paired t-test from n, mean
and sample standard deviation, the Wilcoxon signed-rank test from Spark's ranks of |d|, and Holm's
correction of a family of p-values.

Both tests are two-sided and match scipy.stats on the same differences: ``ttest_rel(a, b)`` and
``wilcoxon(a - b, method="asymptotic", correction=False)`` (zeros dropped, zero_method="wilcox";
the normal approximation with the tie correction, without the continuity correction). With
hundreds of users or more the normal approximation is what scipy uses by default as well.
"""

from __future__ import annotations

import math


def t_test_p(n: int, mean: float, sd: float | None) -> float:
    """Two-sided p-value of the paired t-test, t = mean / (sd / sqrt(n)) on n - 1 degrees of
    freedom; ``sd`` is the sample standard deviation (ddof 1) of the differences. As scipy's
    ``ttest_rel``: NaN when it is undefined (fewer than 2 users, or every difference 0), 0 when the
    differences are all equal and non-zero (t is infinite)."""
    from scipy import stats

    if n < 2 or sd is None or math.isnan(sd):
        return math.nan
    if sd == 0:
        return math.nan if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return float(2 * stats.t.sf(abs(t), n - 1))


def wilcoxon_p(n: int, w_plus: float, ties: float) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test by the normal approximation.

    n: the non-zero differences; w_plus: the sum of the ranks of |d| (ties at their average rank)
    of the positive ones; ties: the sum over groups of equal |d| of t^3 - t (t the group's size).
    As scipy: z = (W+ - n(n+1)/4) / sqrt((n(n+1)(2n+1) - ties/2) / 24), p = 2 Phi(-|z|);
    NaN when no difference is non-zero."""
    from scipy.special import ndtr

    var = (n * (n + 1.0) * (2.0 * n + 1.0) - ties / 2) / 24
    if n == 0 or var <= 0:
        return math.nan
    z = (w_plus - n * (n + 1.0) * 0.25) / math.sqrt(var)
    return float(2 * ndtr(-abs(z)))


def wilcoxon_spark(df, keys: list[str], value: str) -> dict[tuple, dict]:
    """The signed-rank statistics of ``value`` (the paired differences) in each group of ``keys``
    of a Spark DataFrame: {group values: {"n", "w_plus", "ties", "p"}}.

    Zeros and nulls are dropped. The ranks come from the distinct |d| of each group with their
    counts: a tie group of c values after ``below`` smaller ones has the average rank
    below + (c + 1) / 2, so W+ = sum over groups of (its positive values) x (its rank). Only one
    row per group reaches the driver; the window runs over a group's distinct |d| (one task per
    group: sort-based, it spills rather than fails at millions of users).

    Why a shuffle and a sort, not a count of each distinct |d| per partition merged on the
    driver: that is exact, but its size is the number of distinct |d|, which grows with the
    users. An NDCG takes one value per pattern of hit positions and truth-set size (2^50 patterns
    of a top-50 list), so at millions of users most non-zero NDCG differences are distinct, and
    the driver would receive about one value per user; Recall@50's (h1 - h2) / |T| is bounded by
    the truth-set sizes, not by a constant either. Ranks over all users need the users' |d| in one
    order, which is what this shuffle is."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    nonzero = (df.filter(F.col(value).isNotNull() & (F.col(value) != 0))
               .select(*keys, F.abs(value).alias("_a"), (F.col(value) > 0).cast("long").alias("_pos")))
    groups = nonzero.groupBy(*keys, "_a").agg(F.count(F.lit(1)).alias("_c"),
                                              F.sum("_pos").alias("_p"))
    before = Window.partitionBy(*keys).orderBy("_a").rowsBetween(Window.unboundedPreceding, -1)
    ranked = groups.withColumn("_below", F.coalesce(F.sum("_c").over(before), F.lit(0)))
    c = F.col("_c").cast("double")  # as scipy's float64 tie counts; c^3 overflows a long at 2M
    stats = ranked.groupBy(*keys).agg(
        F.sum("_c").alias("n"),
        F.sum(F.col("_p") * (F.col("_below") + (c + 1) / 2)).alias("w_plus"),
        F.sum(c * c * c - c).alias("ties")).collect()
    out = {}
    for r in stats:
        n, w, t = int(r["n"]), float(r["w_plus"]), float(r["ties"])
        out[tuple(r[k] for k in keys)] = {"n": n, "w_plus": w, "ties": t,
                                          "p": wilcoxon_p(n, w, t)}
    return out


def paired_moments(diffs, keys: list[str]) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
    """Per group of ``keys`` of the paired differences ``diffs`` (column ``d``, one row per user):
    the moments {group: row with n, mean, var (population), sd (sample), wins, losses} and the
    signed-rank statistics (``wilcoxon_spark``). ``diffs`` is read twice: cached meanwhile."""
    from pyspark.sql import functions as F

    d = F.col("d")
    diffs = diffs.persist()  # two aggregations read it: the shuffle behind it runs once
    try:
        moments = {tuple(r[k] for k in keys): r for r in diffs.groupBy(*keys).agg(
            F.count(F.lit(1)).alias("n"), F.avg(d).alias("mean"), F.var_pop(d).alias("var"),
            F.stddev_samp(d).alias("sd"), F.avg((d > 0).cast("double")).alias("wins"),
            F.avg((d < 0).cast("double")).alias("losses")).collect()}
        return moments, wilcoxon_spark(diffs, keys, "d")
    finally:
        diffs.unpersist()


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment of one family of p-values, in the input's order: the i-th
    smallest of m is multiplied by m - i + 1, made monotone (never below a smaller p's adjusted
    value) and capped at 1. It controls the family-wise error rate without assuming independence
    (the comparisons of a table share their users). NaN (an undefined test) stays NaN and does not
    count in m."""
    order = sorted((i for i, x in enumerate(p) if not math.isnan(x)), key=lambda i: p[i])
    m = len(order)
    out = [math.nan] * len(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def tost_p(diff: float, se: float, df: float, margin: float) -> float:
    """p-value of the two one-sided tests (Schuirmann's TOST) that the true difference lies
    within (-margin, margin): the larger of the p-values of H0: d <= -margin and of H0: d >= margin,
    each a one-sided t-test of ``diff`` with standard error ``se`` on ``df`` degrees of freedom
    (inf: the normal). Below 0.05 exactly where the 90% interval diff +- t(0.95, df) se lies
    inside the margin. With se = 0: 0 inside the margin, 1 outside."""
    from scipy import stats

    if margin <= 0 or math.isnan(diff) or math.isnan(se):
        return math.nan
    if se == 0:
        return 0.0 if abs(diff) < margin else 1.0
    below = stats.t.sf((diff + margin) / se, df)   # H0: d <= -margin
    above = stats.t.cdf((diff - margin) / se, df)  # H0: d >= margin
    return float(max(below, above))
