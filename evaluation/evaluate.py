"""Evaluate recommendation files (``evaluation/score.py``'s output) the way the paper does, on Spark.

    spark-submit evaluation/evaluate.py --recs RECS --data DIR --output OUT
    spark-submit evaluation/evaluate.py --recs NCE_RECS AUTOREC_RECS --data DIR --output OUT

For each file: R-Precision, NDCG, MAP@K, Precision@K, Recall@K, F1@K (K in 5, 10, 15, 20, 50), and
beside them the common conventions NDCG@K (truncated), HR@K and MRR@K (an extension), with
95% confidence intervals, per user and averaged, for the warm users (truth: their --target split)
and, separately, the cold-start users (truth: their valid+test parts). Then the popularity analysis
of protocol.md over the warm users with a truth set, and, for two or more files, the cold-start
comparison (per-user NDCG, each model against the first).

OUT (published atomically; manifest.json is written last):
    metrics.csv, metrics.json   label, group, target, metric, K, mean, ci95, users
    per_user/                   Parquet: label, group, user_id and one column per metric
    popularity.json, popularity.png, cold_start.png (two or more files with cold-start users)
    paired.csv                  two or more files: the first minus each other (and, with three or
                                more, the best of the others by test NDCG minus each remaining one),
                                per user, NDCG and Recall@50: mean difference ± 95% CI, users, share
                                better / worse, paired t-test and Wilcoxon signed-rank p-values, raw
                                and Holm-corrected (one family per test and metric); --compare
                                names the labels compared (experiment/run.py --seeds: one seed
                                per model; it pools the seeds itself, evaluation/seeds.py)

Every file whose scoring manifest names its MLflow training run gets its metrics (with _ci95) and
the plots logged into that run; a file without one gets a new run in the experiment 'evaluation'.
The paired comparisons are ``evaluation.paired``'s, the logging ``evaluation.mlflow_log``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (spark-submit evaluation/evaluate.py)
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import csv
import datetime as dt
import io
import json
import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from evaluation import plots
from evaluation.mlflow_log import log_to_mlflow
from evaluation.paired import PAIRED, best_other, compared_labels, paired, paired_csv, paired_table
from evaluation.popularity import summary_from_counts
from evaluation.recs import Recs, check_recs, check_users, read_recs
from evaluation.score import read_user_ids
from evaluation.spark_metrics import METRICS, encode_lists, inverse_logs, metric_key, metrics_for, split_name
from evaluation.user_table import (
    USERS_PER_PARTITION,
    co_sharded,
    column,
    sharded_user_table,
    summary_rows,
    user_table,
)
from prepared import schema as S
from prepared.errors import UsageError
from prepared.protocol import TABLE, TOP_K
from runtime.cli import add_options, option, strict_parser, values
from runtime.progress import EVERY, info_lines, spark_progress

log = logging.getLogger("evaluation")


def popularity_counts(wide, labels: list[str], items) -> dict[str, tuple[np.ndarray,
                                                                          np.ndarray]]:
    """label -> (popularity, times recommended) per item, over the warm users with a truth set
    and a list: the per-user table's per-partition counts (``column(i, "pop")``, on one row of
    each partition), summed here; one row per partition, each the size of the catalogue, reaches
    the driver."""
    from pyspark.sql import functions as F

    cols = [column(i, "pop") for i in range(len(labels))]
    times = {label: np.zeros(len(items), np.int64) for label in labels}
    for r in wide.filter(F.col(cols[0]).isNotNull()).select(*cols).collect():
        for label, counts in zip(labels, r):
            times[label] += np.asarray(counts, np.int64)
    popularity = items[S.POP_TRAIN_VALID].to_numpy()
    return {label: (popularity, times[label]) for label in labels}


COLD_GRID = 1000  # the cold-start plot's points: NDCG rounded to 1/COLD_GRID (below a pixel)


def cold_start(users_df, labels: list[str], values=None):
    """The cold-start comparison of NDCG, each of ``labels[1:]`` against ``labels[0]``, over the
    cold-start users every one of them evaluated: (users, {label: (x, y) distinct points on a
    1/COLD_GRID grid}, {label: (better, worse, tied) users}), or None without such a user. One
    aggregation in Spark: what reaches the driver is bounded by the grid, not by the users.
    ``values``: those users' NDCG side by side (columns ``_v0``.. in ``labels``' order, one row
    per user) where the caller has them (evaluate.py: from the per-user table, no shuffle);
    else built from ``users_df`` (label, group, user_id, ndcg) by a grouping by user."""
    from pyspark.sql import functions as F

    if values is None:
        values = (users_df.filter((F.col("group") == "cold") & F.col("label").isin(labels))
                  .groupBy("user_id")
                  .agg(*[F.max(F.when(F.col("label") == label, F.col("ndcg"))).alias(f"_v{i}")
                         for i, label in enumerate(labels)]))
    wide = values.dropna()
    x = F.col("_v0")
    panels = F.array(*[F.struct(F.lit(i).alias("panel"), F.col(f"_v{i}").alias("y"))
                       for i in range(1, len(labels))])
    bins = (wide.select(x.alias("x"), F.explode(panels).alias("_p"))
            .select("x", "_p.panel", "_p.y")
            .groupBy("panel", F.round(F.col("x") * COLD_GRID).alias("bx"),
                     F.round(F.col("y") * COLD_GRID).alias("by"))
            .agg(F.count(F.lit(1)).alias("n"),
                 F.sum((F.col("y") > F.col("x")).cast("long")).alias("better"),
                 F.sum((F.col("y") < F.col("x")).cast("long")).alias("worse"),
                 F.sum((F.col("y") == F.col("x")).cast("long")).alias("tied"))
            .collect())
    if not bins:
        return None
    points, tallies, users = {}, {}, 0
    for i, label in enumerate(labels[1:], start=1):
        mine = [r for r in bins if r["panel"] == i]
        points[label] = (np.array([r["bx"] for r in mine], np.float64) / COLD_GRID,
                         np.array([r["by"] for r in mine], np.float64) / COLD_GRID)
        tallies[label] = tuple(int(sum(r[c] for r in mine)) for c in ("better", "worse", "tied"))
        users = int(sum(r["n"] for r in mine))
    return users, points, tallies


def table(rows: list[dict], labels: list[str], group: str) -> str:
    """The paper's table (mean ± 95% CI) for one user group."""
    by = {(r["label"], r["metric"]): r for r in rows if r["group"] == group}
    width = max(len(x) for x in labels + ["model"])
    head = f"{'model':<{width}}  " + "  ".join(f"{m:>15}" for m in TABLE) + "    users"
    lines = [head, "-" * len(head)]
    for label in labels:
        mine = [r for (lab, _), r in by.items() if lab == label]
        if not mine:  # no user of this group
            continue
        cells = [f"{by[label, m]['mean']:.4f}±{by[label, m]['ci95']:.4f}" if (label, m) in by
                 else "-" for m in TABLE]
        lines.append(f"{label:<{width}}  " + "  ".join(f"{c:>15}" for c in cells)
                     + f"  {mine[0]['users']:>7,}")
    return "\n".join(lines)


def metrics_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["label", "group", "target", "metric", "K", "mean", "ci95", "users"])
    for r in rows:
        name, k = split_name(r["metric"])
        w.writerow([r["label"], r["group"], r["target"], name, "" if k is None else k,
                    f"{r['mean']:.6f}", f"{r['ci95']:.6f}", r["users"]])
    return buf.getvalue()


@dataclass(frozen=True)
class EvaluateConfig:
    """One evaluation; evaluation/evaluate.py's flags are built from these fields."""

    recs: tuple[str, ...] = option(metavar="RECS",
                                   help="recommendation file(s) from evaluation/score.py (or any "
                                        "Parquet with user_id and item_ids); the first is the "
                                        "reference of the cold-start plot")
    data: str = option(help="the prepared directory the users come from")
    output: str = option(help="the report directory itself: metrics.csv and the rest go directly "
                              "in OUTPUT (local path or URI)")
    target: str = option("test", choices=["test", "valid"], help="the warm users' truth split")
    labels: tuple[str, ...] | None = option(None, help="names for the files in tables and plots "
                                                       "(default: the scored model's)")
    compare: tuple[str, ...] | None = option(None, metavar="LABEL",
                                             help="the labels paired.csv and the cold-start plot "
                                                  "compare, the first the reference (default: "
                                                  "every file's, in order); experiment/run.py "
                                                  "--seeds compares one seed per model here and "
                                                  "pools the seeds itself")
    users: str = option("all", help="the users evaluated: all (every user with a truth set), "
                                    "warm, cold, a comma-separated list of raw user ids, or @FILE "
                                    "with one id per line (score.py's --users); every file must "
                                    "list every one of them")
    mlflow_uri: str | None = option(None, help="tracking server (default: the one each file's "
                                               "training run used)")
    no_mlflow: bool = option(False, help="do not log to MLflow")
    overwrite: bool = option(False, help="replace an existing --output")


def evaluate(spark, progress_every: float = EVERY, **kwargs) -> dict:
    """Evaluate with the ``EvaluateConfig`` of ``kwargs`` (the flags' names): the ``recs`` files
    against ``data``'s ``target`` split; publish ``output``; returns the manifest (also
    ``output/manifest.json``). Every ``progress_every`` seconds a progress line of the step
    running (tasks done, rate, time left) on the INFO log: at millions of users it takes minutes."""
    cfg = EvaluateConfig(**{**kwargs, "recs": tuple(kwargs.get("recs", ())),
                            **({"labels": tuple(kwargs["labels"])} if kwargs.get("labels") else {}),
                            **({"compare": tuple(kwargs["compare"])} if kwargs.get("compare")
                               else {})})
    with spark_progress(spark, "evaluation", every=progress_every, log=info_lines(log)) as progress:
        timed = PhaseTimes(progress)
        try:
            return evaluate_steps(spark, cfg, timed)
        finally:
            log.info("evaluation phase seconds: %s", json.dumps(timed.done()))


class PhaseTimes:
    """``spark_progress`` whose ``phase`` also records each phase's wall seconds, logged at the
    end (benchmarks/evaluate_speed.py reads the line) so that a slow evaluation shows its step."""

    def __init__(self, progress: spark_progress):
        self.progress, self.seconds = progress, {}
        self._name, self._t0 = "start", time.perf_counter()

    def phase(self, name: str, total_users: int | None = None) -> None:
        self._close()
        self._name = name
        self.progress.phase(name, total_users)

    def _close(self) -> None:
        now = time.perf_counter()
        self.seconds[self._name] = round(self.seconds.get(self._name, 0.0) + now - self._t0, 2)
        self._t0 = now

    def done(self) -> dict[str, float]:
        self._close()
        return self.seconds


def read_inputs(spark, cfg: EvaluateConfig, prep):
    """(the recommendation files, each label distinct; the labels ``--compare`` names; the
    dataset's items by index, with their train+valid popularity), checked against the data."""
    labels = cfg.labels
    files = [read_recs(spark, p, labels[i] if labels else None) for i, p in enumerate(cfg.recs)]
    seen: dict[str, int] = {}
    for f in files:  # labels name table rows, plot lines and MLflow runs: keep them distinct
        seen[f.label] = seen.get(f.label, 0) + 1
        if seen[f.label] > 1:
            f.label = f"{f.label} #{seen[f.label]}"
    compared = compared_labels(cfg.compare, [f.label for f in files])  # before any Spark job
    items = spark.read.parquet(f"{prep.uri}/{prep.manifest['layout']['items']}") \
        .select(S.ITEM_INDEX, S.ITEM_ID, S.POP_TRAIN_VALID).toPandas().sort_values(S.ITEM_INDEX)
    for f in files:  # the manifest's word first: it explains unknown users and items at once
        if f.manifest.get("data") and f.manifest.get("dataset") != prep.dataset:
            raise UsageError(f"--recs {f.path} was scored on dataset {f.manifest['dataset']}, "
                             f"but --data {cfg.data} is {prep.dataset}")
    return files, compared, items


def output_files(wide, users_df, files: list[Recs], rows: list[dict], pairs: list[dict], items,
                 compared: list[str], dataset: str, target: str, progress: PhaseTimes
                 ) -> tuple[dict, dict[str, bytes]]:
    """(the popularity summary per label, the evaluation's files by name): the metrics, the
    popularity analysis and its plot, paired.csv, and the cold-start plot of the ``compared``
    labels (their NDCG: files of lists shorter than TOP_K have none)."""
    from pyspark.sql import functions as F

    progress.phase("popularity")
    pop_counts = popularity_counts(wide, [f.label for f in files], items)
    pop = {label: summary_from_counts(c, p) for label, (p, c) in pop_counts.items()}
    title = f"{dataset}, {target} users"
    out = {"metrics.csv": metrics_csv(rows).encode(),
           "metrics.json": json.dumps(rows, indent=2).encode(),
           "popularity.json": json.dumps(pop, indent=2).encode(),
           **({"paired.csv": paired_csv(pairs).encode()} if pairs else {}),
           "popularity.png": plots.png_bytes(plots.popularity_density(
               pop_counts, pop, f"Popularity of recommended items ({title})"))}
    progress.phase("cold-start plot")
    index = {f.label: i for i, f in enumerate(files)}
    ndcg = wide.filter(F.col("truth") & F.col(S.COLD)).select(  # null: not listed
        *[F.col(column(index[label], "ndcg")).alias(f"_v{j}") for j, label in enumerate(compared)])
    cold = cold_start(users_df, compared, values=ndcg) if len(compared) > 1 else None
    if cold is not None:
        n_cold, points, tallies = cold
        out["cold_start.png"] = plots.png_bytes(plots.cold_start_scatter(
            compared[0], points, f"Cold-start users of {dataset}: per-user NDCG ({n_cold:,} users)",
            tallies=tallies))
    return pop, out


def per_user_table(spark, prep, cfg: EvaluateConfig, files: list[Recs], ids, catalogue: list[str],
                   inverse_log, per_user: str):
    """(the cached per-user table of every file, whether the lists were read beside the rows).

    The users' truth sets beside every file's lists (as item indices): read shard by shard where
    the files are sharded as the rows (score.py's, whose per-user rows are then written to
    ``per_user`` as they are computed), else one shuffle by user; then one numpy pass per
    partition: the metrics, the input checks' facts and the popularity counts
    (evaluation/user_table.py). Everything after reads the cache, never recomputes it."""
    n_users = int(prep.manifest.get("counts", {}).get("users") or 0)
    partitions = max(int(prep.manifest.get("spark", {}).get("shuffle_partitions", 8)),
                     math.ceil(n_users / USERS_PER_PARTITION))
    ks = [f.k for f in files]
    beside = all(co_sharded(f.manifest, prep) for f in files)
    subset = dict(users=cfg.users, ids=ids)
    if beside:  # as evaluation/score.py writes them
        log.info("the lists are sharded as the dataset's rows: read side by side, no shuffle")
        wide = sharded_user_table(spark, prep, [f.path for f in files], ks, cfg.target,
                                  inverse_log, catalogue,
                                  per_user=(per_user, [f.label for f in files]), **subset)
    else:
        wide = user_table(spark, prep, [encode_lists(f.df, catalogue) for f in files], ks,
                          cfg.target, inverse_log, len(catalogue), partitions, **subset)
    return wide.cache(), beside


def summaries(wide, files: list[Recs], target: str, group) -> tuple[object, list[dict]]:
    """(the long per-user rows: label, group, user_id and the metrics of each file's listed
    users that ``wide`` holds (every one; from sharded files, whose tasks wrote the per-user rows
    themselves, the paired ones); the rows of means and CIs per label, group and metric). The
    means come from the partitions' moments: P rows reach the driver, not an aggregation over
    every user."""
    from pyspark.sql import functions as F

    per_file = [wide.filter(F.col(column(i, "listed"))).select(
        F.lit(f.label).alias("label"), group.alias("group"), "user_id",
        *[F.col(column(i, metric_key(m))).alias(metric_key(m)) for m in metrics_for(f.k)
          if column(i, metric_key(m)) in wide.columns])  # sharded: the paired ones only
        for i, f in enumerate(files)]
    users_df = per_file[0]
    for df in per_file[1:]:  # a file of shorter lists lacks some metric columns: null
        users_df = users_df.unionByName(df, allowMissingColumns=True)
    moments = [column(i, "moments") for i in range(len(files))]
    parts = wide.filter(F.col(moments[0]).isNotNull()).select(*moments).collect()
    rows = [{**r, "target": target if r["group"] == "warm" else "valid+test"}
            for r in summary_rows([list(p) for p in parts], [f.label for f in files],
                                  [f.k for f in files])]
    order = {f.label: i for i, f in enumerate(files)}
    rows.sort(key=lambda r: (order[r["label"]], r["group"] != "warm", METRICS.index(r["metric"])))
    return users_df, rows


def configure(spark, prep) -> None:
    """Spark's settings for this data: the shuffles here are joins and per-user groupings of the
    dataset's positives, sized as the ETL sized them for the same data, AQE merging the small
    ones."""
    spark.conf.set("spark.sql.shuffle.partitions",
                   str(prep.manifest.get("spark", {}).get("shuffle_partitions", 8)))
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "true")
    spark.conf.set("spark.sql.debug.maxToStringFields", "500")  # wide metric plans, not a problem


def evaluate_steps(spark, cfg: EvaluateConfig, progress: PhaseTimes) -> dict:
    """``evaluate``'s work; each step with Spark jobs a ``progress`` phase of its own."""
    labels, target = cfg.labels, cfg.target
    ids = None if cfg.users in ("all", "warm", "cold") else frozenset(read_user_ids(cfg.users))
    from pyspark.sql import functions as F

    from prepared.reader import open_prepared
    from runtime.publish import Publisher

    t0 = time.perf_counter()
    started = dt.datetime.now(dt.UTC)
    if target not in ("test", "valid"):
        raise UsageError(f"--target {target}: choose test or valid")
    if labels and len(labels) != len(cfg.recs):
        raise UsageError(f"--labels: {len(labels)} given for {len(cfg.recs)} --recs files; give one "
                         "per file, in the same order")
    prep = open_prepared(cfg.data)
    configure(spark, prep)
    publisher = Publisher(spark, cfg.output)
    publisher.check_target(cfg.overwrite)
    # everything is computed inside the staging directory: the per-user rows may be written by
    # the tasks that compute them, and a failure anywhere deletes whatever was staged
    with publisher.staging() as tmp:
        progress.phase("reading the recommendation files")
        files, compared, items = read_inputs(spark, cfg, prep)
        catalogue = items[S.ITEM_ID].astype(str).tolist()  # position = item index
        # the NDCG discounts as Spark SQL computes them (the numpy metrics then equal the SQL's), up
        # to the largest possible truth set: the catalogue (one item-sized job)
        inverse_log = inverse_logs(spark, TOP_K + 1 + len(catalogue))

        progress.phase("per-user metrics")
        wide, beside = per_user_table(spark, prep, cfg, files, ids, catalogue, inverse_log,
                                      f"{tmp}/per_user")
        group = F.when(F.col(S.COLD), "cold").otherwise("warm")
        try:
            log.info("checking the users and lists of %s", ", ".join(f.path for f in files))
            check_recs(wide, files, prep)
            n_truth = check_users(wide, files, cfg, ids, prep.dataset, group)
        except UsageError:
            wide.unpersist()
            raise
        users_df, rows = summaries(wide, files, target, group)
        log.info("metrics of %s user(s) x %d file(s) done (%.0fs so far); popularity of the "
                 "recommendations next", f"{sum(n_truth.values()):,}", len(files),
                 time.perf_counter() - t0)
        index = {f.label: i for i, f in enumerate(files)}

        progress.phase("paired differences")
        long_enough = [f.label for f in files if f.k >= TOP_K and f.label in compared]
        long_enough.sort(key=compared.index)
        warm = wide.filter(F.col("truth") & ~F.col(S.COLD))  # each label's values: null unlisted
        pairs = paired(users_df, long_enough, best_other(rows, long_enough),
                       side=(warm, {(label, metric_key(m)): column(index[label], metric_key(m))
                                    for label in long_enough for m in PAIRED}))
        pop, out_files = output_files(wide, users_df, files, rows, pairs, items, long_enough,
                                      prep.dataset, target, progress)
        log.info("popularity and plots done (%.0fs so far); writing the per-user metrics",
                 time.perf_counter() - t0)
        progress.phase("writing the per-user metrics")
        if not beside:  # beside the rows shards, the per-user pass wrote them as it went
            users_df.write.parquet(f"{tmp}/per_user")  # from the cache
        for name, data_bytes in out_files.items():
            publisher.write_bytes(f"{tmp}/{name}", data_bytes)
        if not cfg.no_mlflow:
            log.info("logging %d run(s) to MLflow (%.0fs so far)", len(files),
                     time.perf_counter() - t0)
            progress.phase("logging to MLflow")
        runs = log_to_mlflow(files, rows, pop, out_files, target, publisher.target,
                             cfg.mlflow_uri, pairs) if not cfg.no_mlflow else {}
        manifest = {"kind": "evaluation", "created": started.isoformat(timespec="seconds"),
                    "data": prep.uri, "dataset": prep.dataset, "target": target,
                    "recs": {f.label: f.path for f in files}, "mlflow_runs": runs,
                    "users": cfg.users, "popularity": pop,
                    "seconds": round(time.perf_counter() - t0, 1),
                    "labels": [f.label for f in files], "rows": rows, "paired": pairs,
                    "lists_read": "beside their rows shards" if beside else "shuffled by user"}
        manifest = publisher.write_manifest(manifest)  # last: lists every file
    progress.phase("published")
    wide.unpersist()
    return manifest


def report(m: dict, output: str) -> str:
    """What a person reads at the end: the tables, the popularity summary, where the plots are."""
    lines = [f"Test metrics ({m['dataset']}, warm users, truth: {m['target']}; mean ± 95% CI)",
             table(m["rows"], m["labels"], "warm")]
    if any(r["group"] == "cold" for r in m["rows"]):
        lines += ["", "Cold-start users (held out of training; truth: valid+test)",
                  table(m["rows"], m["labels"], "cold")]
    if m.get("paired"):
        best = next((p["reference"] for p in m["paired"] if p["comparison"] == "best"), None)
        lines += ["", f"Paired per-user differences on {m['target']} (warm users both evaluated; "
                  "mean ± 95% CI; two-sided p-values of the paired t-test and the Wilcoxon "
                  "signed-rank test, Holm-corrected over these lines per test and metric)"
                  + (f"; {best}: the best after the first by test NDCG" if best else ""),
                  paired_table(m["paired"])]
    lines += ["", "Popularity of the recommended items (lower median / top-10% share = more "
              "personalised)",
              f"{'model':<24} {'median':>8} {'mean':>8} {'top-10%':>8} {'coverage':>9} {'gini':>6}"]
    for label, s in m["popularity"].items():
        lines.append(f"{label:<24} {s['median_popularity']:>8.0f} {s['mean_popularity']:>8.1f} "
                     f"{s['share_top10pct']:>8.3f} {s['coverage']:>9.3f} {s['gini']:>6.3f}")
    lines += ["", f"plots: {output}/popularity.png"
              + (f", {output}/cold_start.png" if "cold_start.png" in m["files"] else ""),
              f"all metrics: {output}/metrics.csv; per user: {output}/per_user/"]
    if m["mlflow_runs"]:
        lines.append("MLflow runs: " + ", ".join(f"{k} -> {v}" for k, v in m["mlflow_runs"].items()))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = strict_parser(prog="evaluation/evaluate.py",
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    add_options(p, EvaluateConfig)
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


def main(argv: list[str] | None = None) -> int:
    from runtime.logs import setup_logging
    from runtime.spark import get_spark

    args = build_parser().parse_args(argv)
    setup_logging(args.quiet, ("etl", "evaluation"))
    try:
        spark = get_spark("evaluate")
        m = evaluate(spark, **values(args, EvaluateConfig))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(m, args.output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
