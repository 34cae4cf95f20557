"""Paired comparisons of models evaluated on the same users (evaluation/evaluate.py's paired.csv):
the per-user differences of NDCG and Recall@50, one model against the first and against the best
of the others, with their CIs, win shares, paired t and Wilcoxon tests and Holm's correction; and
their rendering as text and CSV."""

from __future__ import annotations

import csv
import io
import math

from evaluation.spark_metrics import metric_key
from prepared.errors import UsageError

PAIRED = ("NDCG", "Recall@50")
COMPARISONS = ("first", "best")  # paired.csv's comparison column: against the first label, or
# against the best of the others


def compared_labels(compare: tuple[str, ...] | None, labels: list[str]) -> list[str]:
    """The labels ``--compare`` names (every label without it), checked against the files'."""
    if not compare:
        return labels
    unknown = [c for c in compare if c not in labels]
    if unknown:
        raise UsageError(f"--compare {' '.join(compare)}: no file is labelled "
                         f"{', '.join(unknown)}; the labels are {', '.join(labels)} (--labels)")
    return list(compare)


def best_other(rows: list[dict], labels: list[str]) -> str | None:
    """The label other than the first with the highest mean NDCG of the warm users in ``rows``
    (``summary_rows``'), the reference of the "best" comparisons; None with fewer than 3 labels,
    where against the best would repeat against the first."""
    ndcg = {r["label"]: r["mean"] for r in rows if r["group"] == "warm" and r["metric"] == "NDCG"}
    others = [label for label in labels[1:] if label in ndcg]
    return max(others, key=lambda label: ndcg[label]) if len(labels) > 2 and others else None


def side_by_side(warm, labels: list[str]):
    """(one row per user with each label's PAIRED values side by side, {(label, key): column})
    from the long per-user rows ``warm`` (label, user_id, the metric keys): one shuffle by
    user."""
    from pyspark.sql import functions as F

    keys = [metric_key(m) for m in PAIRED]
    column_of = {(label, k): f"_v{i}_{j}" for i, label in enumerate(labels)
                 for j, k in enumerate(keys)}
    wide = (warm.filter(F.col("label").isin(labels)).groupBy("user_id")
            .agg(*[F.max(F.when(F.col("label") == label, F.col(k))).alias(column_of[label, k])
                   for label in labels for k in keys]))
    return wide, column_of


def differences(wide, column_of: dict, plan: list[tuple[str, str, list[str]]]):
    """Long DataFrame (comparison, reference, label, metric, d) of the per-user differences of
    each ``plan`` entry (comparison, reference, others): ``reference`` minus each of ``others``,
    over the users both evaluated, for each of PAIRED. ``wide``: one row per user, each label's
    values in the columns ``column_of[label, metric key]`` (null: not evaluated); no shuffle."""
    from pyspark.sql import functions as F

    keys = [metric_key(m) for m in PAIRED]
    entries = F.array(*[F.struct(F.lit(comparison).alias("comparison"),
                                 F.lit(reference).alias("reference"), F.lit(label).alias("label"),
                                 F.lit(m).alias("metric"),
                                 (F.col(column_of[reference, k])
                                  - F.col(column_of[label, k])).alias("d"))
                        for comparison, reference, rest in plan for label in rest
                        for m, k in zip(PAIRED, keys)])
    return (wide.select(F.explode(entries).alias("_x"))
            .select("_x.comparison", "_x.reference", "_x.label", "_x.metric", "_x.d")
            .filter(F.col("d").isNotNull()))  # a user one of them lacks, or lists too short


def paired(users_df, labels: list[str], best: str | None = None, side=None) -> list[dict]:
    """Per-user paired differences over the warm users both evaluated: the first label minus each
    other one (comparison "first") and, given ``best`` (``best_other``), the best minus each label
    that is neither the first nor the best (comparison "best").

    Each: mean and 95% CI half-width (1.96 std / sqrt(n), ddof 0, as every CI here; a
    t-interval's 1.96 holds from a few hundred users on), n, the share of users the reference wins
    or loses, and two-sided p-values of the paired t-test (``t_p``) and the Wilcoxon signed-rank
    test (``wilcoxon_p``), as scipy.stats computes them (evaluation/significance.py). Holm's
    correction (``t_p_holm``, ``wilcoxon_p_holm``) runs over one family per test and per metric:
    every comparison of that metric in the list, against the first and against the best alike.
    Two models' CIs that overlap can still differ with a CI on their difference that excludes
    zero: the users are the same, and much of each user's variance is shared.

    ``side``: (wide, column_of) as ``side_by_side`` gives them, over the warm users, where the
    caller has them (evaluate.py: its per-user table); else built from ``users_df``'s warm rows."""
    from pyspark.sql import functions as F

    from evaluation.significance import holm, paired_moments, t_test_p

    if len(labels) < 2:
        return []
    plan = [("first", labels[0], labels[1:])]
    others = [label for label in labels[1:] if label != best]
    if best is not None and others:
        plan.append(("best", best, others))
    if side is None:
        side = side_by_side(users_df.filter(F.col("group") == "warm"), labels)
    diffs = differences(*side, plan)
    keys = ["comparison", "reference", "label", "metric"]
    moments, signed_rank = paired_moments(diffs, keys)
    out = []
    for comparison, reference, rest in plan:
        for label in rest:
            for m in PAIRED:
                r = moments.get((comparison, reference, label, m))
                if r is None:  # no shared user, or lists too short
                    continue
                n = int(r["n"])
                w = signed_rank.get((comparison, reference, label, m))
                out.append({"reference": reference, "label": label, "metric": m,
                            "comparison": comparison, "mean_difference": float(r["mean"]),
                            "ci95": float(1.96 * math.sqrt(r["var"] or 0.0) / n ** 0.5), "users": n,
                            "reference_better": float(r["wins"]),
                            "reference_worse": float(r["losses"]),
                            "t_p": t_test_p(n, float(r["mean"]), r["sd"]),
                            "wilcoxon_p": w["p"] if w else math.nan})  # w None: all d are 0
    for m in PAIRED:  # one Holm family per test and metric
        mine = [r for r in out if r["metric"] == m]
        for test in ("t_p", "wilcoxon_p"):
            for r, p in zip(mine, holm([r[test] for r in mine])):
                r[f"{test}_holm"] = p
    return out


def p_value(p: float) -> str:
    """Two significant digits (0.0031, 1.2e-08); "–" where the test is undefined."""
    return "–" if math.isnan(p) else f"{p:.2g}"


def paired_table(rows: list[dict]) -> str:
    """``A − B  NDCG  +0.0031 ± 0.0024 (excludes 0; ...) p = 0.003 (t), 0.004 (Wilcoxon), Holm``
    lines."""
    width = max(len(f"{r['reference']} − {r['label']}") for r in rows)
    lines = []
    for r in rows:
        d, ci = r["mean_difference"], r["ci95"]
        verdict = ("excludes 0" if abs(d) > ci else "includes 0")
        lines.append(f"{r['reference'] + ' − ' + r['label']:<{width}}  {r['metric']:<10} "
                     f"{d:+.4f} ± {ci:.4f} ({verdict}; better for {r['reference_better']:.0%} "
                     f"of {r['users']:,} users, worse for {r['reference_worse']:.0%}); "
                     f"p = {p_value(r['t_p_holm'])} (t), {p_value(r['wilcoxon_p_holm'])} "
                     "(Wilcoxon), Holm-corrected")
    return "\n".join(lines)


def paired_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["reference", "label", "metric", "mean_difference", "ci95", "users",
                "reference_better", "reference_worse", "comparison", "t_p", "wilcoxon_p",
                "t_p_holm", "wilcoxon_p_holm"])
    for r in rows:
        w.writerow([r["reference"], r["label"], r["metric"], f"{r['mean_difference']:.6f}",
                    f"{r['ci95']:.6f}", r["users"], f"{r['reference_better']:.4f}",
                    f"{r['reference_worse']:.4f}", r["comparison"],
                    *[f"{r[k]:.6g}" for k in ("t_p", "wilcoxon_p", "t_p_holm", "wilcoxon_p_holm")]])
    return buf.getvalue()
