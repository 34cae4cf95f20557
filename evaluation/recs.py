"""The recommendation files an evaluation reads (``evaluation/score.py``'s output, or any Parquet
of user_id and item_ids best first), and the checks that refuse lists whose metrics would be
wrong without showing it, each naming the first offending user and the fix."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evaluation.score import MARKER as RECS_MARKER
from evaluation.user_table import column
from prepared.errors import UsageError
from prepared.protocol import KS, TOP_K

if TYPE_CHECKING:
    from evaluation.evaluate import EvaluateConfig

log = logging.getLogger("evaluation")


@dataclass
class Recs:
    path: str
    label: str
    manifest: dict      # the scoring manifest ({} for a file written elsewhere)
    df: object          # Spark DataFrame: user_id string, item_ids array<string>
    k: int              # list length evaluated: the file's k (its manifest's, else its longest
                        # list), at most TOP_K; metrics beyond it are not computed


def read_recs(spark, path: str, label: str | None) -> Recs:
    """A recommendation file, its columns checked (user_id, item_ids best first)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    from prepared.files import FILES
    from runtime.publish import Publisher, qualify, read_text

    path = qualify(path)
    jvm = spark.sparkContext._jvm
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    fs = hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(hpath):
        raise UsageError(f"--recs {path}: no such file or directory; write one with "
                         "spark-submit evaluation/score.py --model MODEL --data DIR --output RECS")
    text = read_text(spark, f"{path}/{RECS_MARKER}")
    manifest = json.loads(text) if text else {}
    if manifest:  # written by evaluation/score.py: exactly the files it lists, or incomplete
        if FILES not in manifest:
            raise UsageError(f"--recs {path}: written by an older version (its {RECS_MARKER} lists "
                             "no files); score it again with evaluation/score.py")
        Publisher(spark, path, marker=RECS_MARKER).verify(path, manifest, f"--recs {path}")
    try:
        df = spark.read.parquet(path)
    except Exception as e:
        raise UsageError(f"--recs {path}: not a Parquet file or directory "
                         f"({str(e).splitlines()[0][:200]})") from None
    missing = [c for c in ("user_id", "item_ids") if c not in df.columns]
    if missing:
        raise UsageError(f"--recs {path}: missing column(s) {', '.join(missing)} (found: "
                         f"{', '.join(df.columns)}); a recommendation file has user_id (string) and "
                         "item_ids (list of item ids, best first), as evaluation/score.py writes")
    t = df.schema["item_ids"].dataType
    if not isinstance(t, ArrayType):
        raise UsageError(f"--recs {path}: column item_ids is {t.simpleString()}, expected a list "
                         "of item ids (best first)")
    df = df.select(F.col("user_id").cast("string").alias("user_id"),
                   F.col("item_ids").cast(ArrayType(StringType())).alias("item_ids"))
    name = label or manifest.get("model_name") or path.rstrip("/").rsplit("/", 1)[-1]
    k = manifest.get("k") or df.agg(F.max(F.size("item_ids"))).first()[0] or 0
    if k < min(KS):
        raise UsageError(f"--recs {path}: its lists hold {k} item(s); the smallest cut-off of the "
                         f"metrics is {min(KS)}: score it again with --k {TOP_K}")
    if k < TOP_K:
        log.warning("%s: top-%d lists (%s): metrics at cut-offs above %d, and NDCG and "
                    "R-Precision (defined on the top %d), are not computed; score with --k %d "
                    "for all of them", name, k, "its manifest's k" if manifest.get("k") else
                    "its longest list", k, TOP_K, TOP_K)
    if k > TOP_K:  # the protocol's metrics are defined on the top-50 list
        df = df.withColumn("item_ids", F.slice("item_ids", 1, TOP_K))
    return Recs(path=path, label=name, manifest=manifest, df=df, k=min(k, TOP_K))


def check_recs(wide, files: list[Recs], prep) -> None:
    """Refuse lists whose metrics would be wrong without showing it, naming the first offending
    user (in user_id order) and the fix: a user not in ``prep`` (lists for another dataset), an
    item outside its catalogue, a user on more than one row (counted once per row in every mean),
    a list that repeats an item (a repeated true item is a hit at each of its positions: one can
    give NDCG and Recall@50 far above 1). The files in order, each's checks in that order.
    ``wide``: the per-user table (evaluation/user_table.py), which holds each user's row count,
    smallest stray id and repeat per file. One aggregation for every file: one row of counts and
    first offenders reaches the driver, whatever the number of users."""
    from pyspark.sql import functions as F

    none = F.lit(None).cast("string")
    aggs = []
    for i, _ in enumerate(files):
        rows, stray, repeat = (F.col(column(i, c)) for c in ("rows", "stray", "repeat"))
        checks = {"unknown": ((rows > 0) & ~F.col("known"), none),
                  "stray": (stray.isNotNull(), stray),
                  "twice": (rows > 1, none),
                  "repeat": (repeat.isNotNull(), repeat)}
        for name, (bad, item) in checks.items():
            aggs += [F.count(F.when(bad, 1)).alias(f"{name}_n_{i}"),
                     F.min(F.when(bad, F.struct(F.col("user_id").alias("user"),
                                                item.alias("item")))).alias(f"{name}_{i}")]
    r = wide.agg(*aggs).first()

    def shown(v) -> str:
        return "null" if v is None else str(v)

    for i, recs in enumerate(files):
        where = f"--recs {recs.path}"
        n = {name: r[f"{name}_n_{i}"] for name in ("unknown", "stray", "twice", "repeat")}
        first = {name: r[f"{name}_{i}"] for name in n}
        if n["unknown"]:
            raise UsageError(f"{where}: {n['unknown']:,} user(s) are not users of --data "
                             f"{prep.uri}, e.g. {shown(first['unknown']['user'])} (the first by "
                             "user_id); score the dataset these recommendations are meant for")
        if n["stray"]:
            raise UsageError(f"{where}: {n['stray']:,} user(s) have items outside the catalogue "
                             f"of --data {prep.uri}, first user {shown(first['stray']['user'])} "
                             f"with item {shown(first['stray']['item'])}; re-run "
                             "evaluation/score.py on that --data, or drop the unknown items")
        if n["twice"]:
            raise UsageError(f"{where}: {n['twice']:,} user(s) have more than one row (each row "
                             f"would count in every mean), first user "
                             f"{shown(first['twice']['user'])}; re-run evaluation/score.py, or "
                             "keep one list per user")
        if n["repeat"]:
            raise UsageError(f"{where}: {n['repeat']:,} user(s) have a list that repeats an item "
                             "(a repeated true item would count as a hit at each position), first "
                             f"user {shown(first['repeat']['user'])} repeats item "
                             f"{shown(first['repeat']['item'])}; re-run evaluation/score.py, or "
                             "deduplicate the lists")


def uncovered(f: Recs, missing: dict[str, int], example: str, users: str, target: str) -> str:
    """The refusal of a file that lists only some of the evaluated users: its means would be
    over other users than another file's (a table's rows not comparable), or than the dataset's."""
    said = " and ".join(f"{n:,} {g}" for g, n in sorted(missing.items(), reverse=True))
    scored = f.manifest.get("users")
    hint = (f" (it was scored with --users {scored})" if scored and scored != users else "")
    return (f"--recs {f.path}: {said} users with a truth set ({target} for the warm ones) have no "
            f"list in it, e.g. user {example}{hint}; evaluate the users it covers with --users "
            f"(warm, cold, @FILE or a list of ids; now {users}), or score every user of the "
            "dataset (evaluation/score.py --users all)")


def check_users(wide, files: list[Recs], cfg: EvaluateConfig, ids: frozenset | None,
                dataset: str, group) -> dict[bool, int]:
    """Users with a truth set per group (cold: True), from the cached per-user table ``wide``
    (one Spark job, two with ``--users`` ids); refuses, naming the fix, a user named but not in
    the data, nothing to evaluate, and a file that leaves out users another file lists."""
    from pyspark.sql import functions as F

    target, data = cfg.target, cfg.data
    unlisted = [agg for i in range(len(files)) for agg in (
        F.count(F.when(~F.col(column(i, "listed")), 1)).alias(f"_m{i}"),
        F.min(F.when(~F.col(column(i, "listed")), F.col("user_id"))).alias(f"_e{i}"))]
    counts = wide.filter(F.col("truth")).groupBy(group.alias("group")) \
        .agg(F.count(F.lit(1)).alias("count"), *unlisted).collect()
    n_truth = {r["group"] == "cold": r["count"] for r in counts}
    if ids is not None:  # a user named but not in the dataset would be silently left out
        known = wide.filter(F.col("known") & F.col("user_id").isin(sorted(ids))) \
            .select("user_id").collect()
        absent = sorted(ids - {r[0] for r in known})
        if absent:
            raise UsageError(f"--users: {len(absent)} of {len(ids)} user ids are not in "
                             f"--data {data}, e.g. {', '.join(absent[:5])}; ids are the "
                             "raw ids of the dataset")
    if cfg.users != "all" and not sum(n_truth.values()):
        raise UsageError(f"--users {cfg.users}: none of these users has a truth set in --data "
                         f"{data}, so there is nothing to evaluate")
    if not n_truth.get(False) and cfg.users in ("all", "warm"):
        raise UsageError(f"--data {data}: no warm user has a {target} item, so there is nothing to "
                         f"evaluate (was it prepared with --holdout-fraction 0?)")
    log.info("evaluating %d file(s) on %s: %s warm users with a %s item, %s cold-start users",
             len(files), dataset, f"{n_truth.get(False, 0):,}", target,
             f"{n_truth.get(True, 0):,}")
    missing = {f.label: {r["group"]: r[f"_m{i}"] for r in counts if r[f"_m{i}"]}
               for i, f in enumerate(files)}
    for i, f in enumerate(files):  # means over other users than another file's: refused
        if missing[f.label]:
            raise UsageError(uncovered(f, missing[f.label], min(
                r[f"_e{i}"] for r in counts if r[f"_e{i}"] is not None), cfg.users, target))
    return n_truth
