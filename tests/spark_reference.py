"""The metrics as Spark SQL expressions: a reference for the tests, no longer a path of the code.

evaluation/evaluate.py computed the per-user metrics with these expressions (Spark's higher-order
array functions on the executors) until the numpy pass on Arrow batches
(``evaluation.spark_metrics.batch_metrics``) replaced them: interpreted row by row, their O(L^2)
hit counts and forty expressions cost minutes of CPU at millions of users. The numpy pass sums in
the order ``aggregate`` does and takes its NDCG discounts from Spark SQL
(``evaluation.spark_metrics.inverse_logs``), so the two agree to the last bit;
tests/evaluation/test_arrow_metrics.py checks that, user by user. ``summarise`` is Spark's own mean and CI
(avg, stddev_pop) that evaluate.py's per-partition moments (``evaluation.user_table
.summary_rows``) and evaluation/seeds.py are checked against.
"""

from __future__ import annotations

from evaluation.spark_metrics import METRICS, metric_key, metrics_for
from prepared.protocol import KS, TOP_K


def _sum(expr: str) -> str:
    return f"aggregate({expr}, 0D, (acc, v) -> acc + v)"


def _idcg(n: str) -> str:
    return f"aggregate(sequence(1, {n}), 0D, (acc, i) -> acc + 1D / log2(i + 1))"


def per_user(df, recs_col: str = "item_ids", truth_col: str = "truth", k: int = TOP_K):
    """``df`` with one column per metric of ``metrics_for(k)`` (named by ``metric_key``) for each
    user with a non-empty truth set (others are dropped). ``recs_col`` array<string> best first,
    at most ``k`` long (a shorter list: its missing positions are misses); ``truth_col``
    array<string> without duplicates."""
    from pyspark.sql import functions as F

    ks = [K for K in KS if K <= k]
    length = max(ks)
    df = (df.filter(F.size(truth_col) > 0)
          .withColumn("_n", F.size(truth_col).cast("int"))
          .withColumn("_h", F.expr(f"transform({recs_col}, x -> IF(array_contains({truth_col}, x), "
                                   "1D, 0D))"))
          # a list shorter than the largest K: the missing positions are misses
          .withColumn("_h", F.expr(f"concat(_h, array_repeat(0D, greatest(0, {length} - size(_h))))"))
          # hits@i for i = 1..L (O(L^2) per user: L is 50)
          .withColumn("_c", F.expr(f"transform(_h, (x, i) -> {_sum('slice(_h, 1, i + 1)')})")))
    first = "array_position(_h, 1D)"  # the first hit's rank (1-based), 0 when none
    cols = {
        "NDCG": F.expr(f"{_sum('transform(_h, (x, i) -> x / log2(i + 2))')} / {_idcg('_n')}"),
        "R-Precision": F.expr("element_at(_c, least(_n, size(_h))) / _n"),
    }
    for k in ks:
        hits = f"element_at(_c, {k})"
        cols[f"Precision@{k}"] = F.expr(f"{hits} / {k}")
        cols[f"Recall@{k}"] = F.expr(f"{hits} / _n")
        cols[f"MAP@{k}"] = F.expr(f"{_sum(f'transform(slice(_c, 1, {k}), (c, i) -> c / (i + 1))')} / {k}")
        p, r = f"({hits} / {k})", f"({hits} / _n)"
        cols[f"F1@{k}"] = F.expr(f"IF({p} + {r} > 0, 2 * {p} * {r} / ({p} + {r}), 0D)")
        cols[f"NDCG@{k} (truncated)"] = F.expr(
            f"{_sum(f'transform(slice(_h, 1, {k}), (x, i) -> x / log2(i + 2))')} / "
            f"{_idcg(f'least(_n, {k})')}")
        cols[f"HR@{k}"] = F.expr(f"IF({hits} > 0, 1D, 0D)")
        cols[f"MRR@{k}"] = F.expr(f"IF({first} > 0 AND {first} <= {k}, 1D / {first}, 0D)")
    df = df.select("*", *[cols[m].cast("double").alias(metric_key(m)) for m in metrics_for(k)])
    return df.drop("_n", "_h", "_c")


def summarise(per_user_df, group_cols: list[str]) -> list[dict]:
    """One dict per group and metric: mean, 95% CI half-width (1.96 std_pop / sqrt(n)) and n."""
    from pyspark.sql import functions as F

    # metrics a file's k did not allow are absent (one file) or null (beside other files)
    present = [m for m in METRICS if metric_key(m) in per_user_df.columns]
    aggs = [F.count(F.lit(1)).alias("_users")]
    for m in present:
        aggs += [F.avg(metric_key(m)).alias(f"{metric_key(m)}__mean"),
                 F.stddev_pop(metric_key(m)).alias(f"{metric_key(m)}__std")]
    out = []
    for row in per_user_df.groupBy(*group_cols).agg(*aggs).collect():
        n = row["_users"]
        for m in present:
            if row[f"{metric_key(m)}__mean"] is None:  # not computed for this group's lists
                continue
            std = row[f"{metric_key(m)}__std"] or 0.0
            out.append({**{c: row[c] for c in group_cols}, "metric": m,
                        "mean": float(row[f"{metric_key(m)}__mean"]),
                        "ci95": float(1.96 * std / n ** 0.5), "users": int(n)})
    return out
