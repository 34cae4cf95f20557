"""Test metrics and paired differences pooled over training seeds (experiment/run.py --seeds).

One training seed per model gives confidence intervals that cover the sampling of users only: on
ml-100k AutoRec's test NDCG moved by 0.0073 between two runs at the same lambda, about twice a
gain the table had called significant. With S seeds of each model (each one trained, scored and
evaluated as a model of its own, its per-user values in evaluation/evaluate.py's ``per_user``):

- a metric of a model: per user u the mean over seeds y_u = mean_s x_us; the table's mean is the
  mean over seeds of the per-seed means (= mean_u y_u: the users are the same in every seed), and
  its 95% CI half-width is

      t(0.975, nu) sqrt( Var_u(y) / U  +  Var_s(m_s) / S )

  with Var_u the users' variance (ddof 0, as every CI of evaluate.py) and Var_s the sample variance
  (ddof 1) of the S per-seed means m_s. The first term is the users' sampling with the seed noise
  averaged in; the second is the seed noise of the mean. It is conservative: the seed noise is in
  both terms (Var_u(y) still holds each user's seed-to-seed jitter, divided by S), so it is counted
  at most twice, never missed. The quantile is Student's t on Satterthwaite's degrees of freedom

      nu = (a + b)^2 / ( a^2 / (U - 1)  +  b^2 / (S - 1) ),   a = Var_u(y) / U,  b = Var_s(m_s) / S

  because the seed term is estimated from S - 1 = 2 degrees of freedom: where it dominates, 1.96
  under-covers (t(0.975, 2) = 4.30); where the users' term dominates nu is large and the quantile
  is 1.96's. Simulated (tests/evaluation/test_seeds.py; 893 users, 3 seeds, user sd 0.03, noise
  0.02, seed sd 0 / 0.002 / 0.004 / 0.008) the coverage is 96.4 / 94.4 / 92.5 / 92.9% with t on
  nu against 96.2 / 92.6 / 87.8 / 84.1% with 1.96: better, not exact where the seed term
  dominates (nu is estimated too; t on S - 1 alone would cover 97.6-100%, doubling every metric's
  interval where the users dominate). With one seed it is evaluate.py's CI exactly (its 1.96: there is no
  seed term, and from 500 users on t(0.975, U - 1) is within 0.2% of it).
- equivalence ("level"): a difference is called level with a margin delta only by the two one-
  sided tests (``evaluation.significance.tost_p``): both H0: d <= -delta and H0: d >= delta are
  rejected at 5%, i.e. the 90% interval on the same nu lies inside (-delta, delta).
- the seed spread beside it: the standard deviation (ddof 1) of the per-seed means, min and max.
- a paired difference of models A and B: seed s of A against seed s of B, per user
  d_us = x^A_us - x^B_us, pooled by the same formula over d; and per seed its own row (mean, the
  users-only CI, p-values). The pooled p-values are the paired t-test and the Wilcoxon signed-rank
  test on the per-user seed-mean differences mean_s d_us (evaluation/significance.py), Holm-
  corrected over one family per test and metric (the per-seed rows: one family per seed too).
  A model beats another only where the pooled interval excludes 0.

Only users evaluated in every seed of the models concerned count (in an experiment every seed
scores every user, so that is all of them). Everything is aggregated in Spark: what reaches the
driver is one row per model, metric and seed, whatever the number of users.
"""

from __future__ import annotations

import math

POOLED = "pooled"  # the ``seed`` of a pooled paired row (per-seed rows carry their seed)
EQUIVALENCE = 0.01  # "level": within 1% of the reference's mean, by the two one-sided tests


def pooled_interval(seed_means: list[float], user_var: float, users: int) -> dict:
    """A pooled mean and its 95% CI half-width from the S per-seed means and the users' variance
    (ddof 0) of the per-user seed means; with the seed spread: ``seed_sd`` (ddof 1; NaN with one
    seed), ``seed_min``, ``seed_max``."""
    s = len(seed_means)
    mean = sum(seed_means) / s
    seed_var = sum((m - mean) ** 2 for m in seed_means) / (s - 1) if s > 1 else 0.0
    a, b = max(user_var, 0.0) / users, seed_var / s
    df = satterthwaite(a, users - 1, b, s - 1) if s > 1 else math.inf
    return {"mean": mean, "ci95": quantile(df) * math.sqrt(a + b), "se": math.sqrt(a + b),
            "df": df, "seeds": s, "seed_sd": math.sqrt(seed_var) if s > 1 else math.nan,
            "seed_min": min(seed_means), "seed_max": max(seed_means)}


def satterthwaite(a: float, df_a: float, b: float, df_b: float) -> float:
    """Satterthwaite's degrees of freedom of the variance estimate a + b, whose terms have df_a
    and df_b; inf where the sum is 0 (nothing to estimate) and a term with no df counts 0."""
    den = sum(x * x / d for x, d in ((a, df_a), (b, df_b)) if d > 0 and x > 0)
    return (a + b) ** 2 / den if den > 0 else math.inf


def quantile(df: float, level: float = 0.975) -> float:
    """Student's t quantile on ``df`` degrees of freedom; 1.96 (evaluate.py's) on infinitely
    many, so one seed keeps evaluate.py's CI to the bit."""
    if math.isinf(df) and level == 0.975:
        return 1.96
    from scipy import stats

    return float(stats.t.ppf(level, df))  # on df = inf scipy's t is the normal


def _wide(users_df, labels: list[str], keys: list[str]):
    """One row per warm user: column ``_v{i}_{j}`` = label i's value of metric key j (null where
    that label has no value for the user). One shuffle by user."""
    from pyspark.sql import functions as F

    return (users_df.filter((F.col("group") == "warm") & F.col("label").isin(labels))
            .groupBy("user_id")
            .agg(*[F.max(F.when(F.col("label") == label, F.col(k))).alias(f"_v{i}_{j}")
                   for i, label in enumerate(labels) for j, k in enumerate(keys)]))


def _seed_mean(cols: list) -> object:
    """The per-user mean over seeds of ``cols``: null unless every seed has a value."""
    total = cols[0]
    for c in cols[1:]:
        total = total + c
    return total / len(cols)


def pooled_metrics(users_df, labels: dict[str, list[str]], metrics: list[str]) -> list[dict]:
    """Per model (``labels``: model -> its seeds' evaluation labels, in seed order) and metric of
    ``metrics`` present in ``users_df`` (evaluate.py's per-user values): a row shaped as
    evaluate.py's (label = the model, group "warm", metric, mean, ci95, users) with ``seeds``,
    ``seed_sd``, ``seed_min``, ``seed_max`` and ``seed_means``."""
    from pyspark.sql import functions as F

    from evaluation.spark_metrics import metric_key

    keys = [metric_key(m) for m in metrics if metric_key(m) in users_df.columns]
    names = {metric_key(m): m for m in metrics}
    flat = [label for ls in labels.values() for label in ls]
    index = {label: i for i, label in enumerate(flat)}
    wide = _wide(users_df, flat, keys)
    aggs, cells = [], []
    for model, ls in labels.items():
        for j, k in enumerate(keys):
            xs = [F.col(f"_v{index[label]}_{j}") for label in ls]
            y = _seed_mean(xs)
            t = len(cells)
            cells.append((model, k, len(ls)))
            aggs += [F.count(y).alias(f"n{t}"), F.var_pop(y).alias(f"v{t}"),
                     *[F.avg(F.when(y.isNotNull(), x)).alias(f"m{t}_{s}")
                       for s, x in enumerate(xs)]]
    r = wide.agg(*aggs).first()
    out = []
    for t, (model, k, seeds) in enumerate(cells):
        n = int(r[f"n{t}"])
        if n == 0:  # not computed for these lists (too short), or no user in every seed
            continue
        means = [float(r[f"m{t}_{s}"]) for s in range(seeds)]
        out.append({"label": model, "group": "warm", "metric": names[k], "users": n,
                    **pooled_interval(means, float(r[f"v{t}"] or 0.0), n),
                    "seed_means": means})
    return out


def pooled_pairs(users_df, labels: dict[str, list[str]], seeds: list[int],
                 plan: list[tuple[str, str, list[str]]], metrics: list[str]) -> list[dict]:
    """Paired differences, reference minus label, of each ``plan`` entry (comparison, reference,
    others), seed s of one against seed s of the other: per seed (``seed`` its value) and pooled
    (``seed`` POOLED), in evaluate.py's paired rows' shape (mean_difference, ci95, users,
    reference_better/worse, t_p, wilcoxon_p and their _holm forms) with ``seeds`` and the seed
    spread of the pooled rows. Over the users every seed of both models evaluated."""
    from pyspark.sql import functions as F

    from evaluation.significance import holm, paired_moments, t_test_p
    from evaluation.spark_metrics import metric_key

    keys = [metric_key(m) for m in metrics]
    models = list(dict.fromkeys(m for _, ref, rest in plan for m in [ref, *rest]))
    flat = [label for m in models for label in labels[m]]
    index = {label: i for i, label in enumerate(flat)}
    wide = _wide(users_df, flat, keys)
    entries = []
    for comparison, reference, rest in plan:
        for label in rest:
            for m, j in zip(metrics, range(len(keys))):
                ds = [F.col(f"_v{index[a]}_{j}") - F.col(f"_v{index[b]}_{j}")
                      for a, b in zip(labels[reference], labels[label])]
                y = _seed_mean(ds)
                head = [F.lit(comparison).alias("comparison"), F.lit(reference).alias("reference"),
                        F.lit(label).alias("label"), F.lit(m).alias("metric")]
                entries.append(F.struct(*head, F.lit(POOLED).alias("seed"), y.alias("d")))
                entries += [F.struct(*head, F.lit(str(s)).alias("seed"),
                                     F.when(y.isNotNull(), d).alias("d"))
                            for s, d in zip(seeds, ds)]
    group = ["comparison", "reference", "label", "metric", "seed"]
    diffs = (wide.select(F.explode(F.array(*entries)).alias("_x"))
             .select(*[f"_x.{c}" for c in group], "_x.d").filter(F.col("d").isNotNull()))
    moments, signed_rank = paired_moments(diffs, group)
    out = []
    for comparison, reference, rest in plan:
        for label in rest:
            for m in metrics:
                key = (comparison, reference, label, m)
                pooled = moments.get((*key, POOLED))
                if pooled is None:  # no user in every seed of both, or lists too short
                    continue
                per_seed = [moments[(*key, str(s))] for s in seeds]
                for seed, r in [(POOLED, pooled), *zip(seeds, per_seed)]:
                    n = int(r["n"])
                    w = signed_rank.get((*key, str(seed)))
                    row = {"reference": reference, "label": label, "metric": m,
                           "comparison": comparison, "seed": str(seed),
                           "mean_difference": float(r["mean"]),
                           "ci95": 1.96 * math.sqrt(float(r["var"] or 0.0) / n), "users": n,
                           "se": math.sqrt(float(r["var"] or 0.0) / n), "df": math.inf,
                           "reference_better": float(r["wins"]),
                           "reference_worse": float(r["losses"]),
                           "t_p": t_test_p(n, float(r["mean"]), r["sd"]),
                           "wilcoxon_p": w["p"] if w else math.nan, "seeds": 1}
                    if seed == POOLED:  # the mean over seeds, the users' and seeds' CI
                        spread = pooled_interval([float(x["mean"]) for x in per_seed],
                                                 float(r["var"] or 0.0), n)
                        row.update({"mean_difference": spread["mean"], "ci95": spread["ci95"],
                                    **{k: spread[k] for k in ("se", "df", "seeds", "seed_sd",
                                                              "seed_min", "seed_max")}})
                    out.append(row)
    for m in metrics:  # Holm: one family per test and metric, per seed (pooled: its own)
        for seed in [POOLED, *map(str, seeds)]:
            mine = [r for r in out if r["metric"] == m and r["seed"] == seed]
            for test in ("t_p", "wilcoxon_p"):
                for r, p in zip(mine, holm([r[test] for r in mine])):
                    r[f"{test}_holm"] = p
    return out


def paired_csv(rows: list[dict]) -> str:
    """evaluate.py's paired.csv columns, then ``seed`` (a seed, or "pooled") and the pooled rows'
    ``seeds`` and seed spread of the mean difference."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["reference", "label", "metric", "mean_difference", "ci95", "users",
                "reference_better", "reference_worse", "comparison", "t_p", "wilcoxon_p",
                "t_p_holm", "wilcoxon_p_holm", "seed", "seeds", "seed_sd", "seed_min",
                "seed_max"])
    num = lambda r, k, f: "" if k not in r or math.isnan(r[k]) else format(r[k], f)  # noqa: E731
    for r in rows:
        w.writerow([r["reference"], r["label"], r["metric"], f"{r['mean_difference']:.6f}",
                    f"{r['ci95']:.6f}", r["users"], f"{r['reference_better']:.4f}",
                    f"{r['reference_worse']:.4f}", r["comparison"],
                    *[f"{r[k]:.6g}" for k in ("t_p", "wilcoxon_p", "t_p_holm", "wilcoxon_p_holm")],
                    r["seed"], r["seeds"], num(r, "seed_sd", ".6f"), num(r, "seed_min", ".6f"),
                    num(r, "seed_max", ".6f")])
    return buf.getvalue()
