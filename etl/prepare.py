"""Prepare a raw recommender dataset for the AutoRec family: binarise, split, R*, negatives, shard.

    spark-submit etl/prepare.py --dataset ml-100k --input ../shared/datasets/ml-100k/u.data --output DIR
    python etl/prepare.py --dataset synthetic --users 100000 --items 5000 --positives 3000000 --output DIR

Writes the prepared directory described in ``prepared/schema.py`` (and the README), atomically.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (spark-submit etl/prepare.py): make `etl` importable
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import datetime as dt
import hashlib
import logging
import os
import subprocess
import time

from etl import __version__
from etl.config import DATASETS, ETLConfig
from prepared import schema as S
from prepared.errors import InputDataError, UsageError
from runtime.cli import add_options, strict_parser, values
from runtime.logs import setup_logging

log = logging.getLogger("etl")


def build_parser() -> argparse.ArgumentParser:
    p = strict_parser(
        prog="etl/prepare.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="Datasets and their protocol defaults (positive rule, split):\n" + "\n".join(
            f"  {name:16s} {spec.positive:8s} {spec.split:7s} input: "
            f"{', '.join(spec.default_files) or ('generated' if name == 'synthetic' else 'a CSV file')}"
            for name, spec in DATASETS.items()) +
        "\n\nThe output directory is complete when it holds manifest.json (written last).")
    add_options(p, ETLConfig)
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


def config_from_args(args: argparse.Namespace) -> ETLConfig:
    return ETLConfig(**values(args, ETLConfig))


def describe_inputs(spark, files: list[str]) -> list[dict]:
    """Size and sha256 of each input file (sha256 for local files only: remote ones stay remote)."""
    from etl.sources import _is_local, _local
    out = []
    for f in files:
        if _is_local(f):
            h = hashlib.sha256()
            with open(_local(f), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
            out.append({"path": f, "bytes": os.path.getsize(_local(f)), "sha256": h.hexdigest()})
        else:
            jvm = spark.sparkContext._jvm
            path = jvm.org.apache.hadoop.fs.Path(f)
            fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            out.append({"path": f, "bytes": int(fs.getFileStatus(path).getLen()), "sha256": None})
    return out


def code_version() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    return f"{__version__}+g{sha}{'.dirty' if dirty else ''}" if sha else __version__


def run(cfg: ETLConfig, spark=None) -> dict:
    """Run the whole ETL for ``cfg`` and publish ``cfg.output``; returns the manifest. One
    function although long: the steps run in order under one lock and in one staging directory,
    each step's outputs the next one's inputs (``etl.pipeline``, ``etl.write`` hold the steps)."""
    from pyspark.sql import DataFrame

    from etl import pipeline as P
    from etl import write as W
    from etl.sources import check_local_headers, labelled_inputs
    from prepared.protocol import rstar_per_item, rstar_z
    from runtime.publish import Publisher, local_lock
    from runtime.spark import get_spark

    started = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    held = local_lock(cfg.output)  # a second writer is refused here, before Spark starts
    if held is not None:
        held.acquire()
    try:
        labelled = [] if cfg.spec.layout.generated else labelled_inputs(cfg)
        files = [f for f, _ in labelled]
        labels = {f: label for f, label in labelled if label} or None
        if cfg.spec.layout.named_columns:
            check_local_headers(files, cfg)  # a wrong column fails here, before Spark starts
        spark = spark or get_spark(f"prepare-{cfg.dataset}")
        publisher = Publisher(spark, cfg.output, lock=held)
        publisher.check_target(cfg.overwrite)
    except BaseException:
        if held is not None:
            held.release()
        raise
    inputs = describe_inputs(spark, files)
    for entry in inputs if labels else []:
        entry["split"] = labels[entry["path"]]
    partitions = P.auto_partitions(cfg, sum(i["bytes"] for i in inputs))
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    progress, counts = P.Progress(), {}
    log.info("preparing %s (%s) -> %s (%d input files, %d shards)", cfg.name, cfg.dataset,
             publisher.target, len(files), partitions)

    cached = []
    try:
        with publisher.staging() as tmp:
            rows = P.read_validated(spark, cfg, files, progress, counts, labels)
            # the per-user passes' data between jobs, removed before publishing (see Work)
            work = P.Work(f"{tmp}/_work", partitions)
            per_user, totals = P.user_lists(rows, cfg, work, progress, counts)
            cached = [per_user]
            users = P.index_users(per_user, cfg, progress, counts)
            items = P.index_items(per_user, progress, counts)
            cached += [users, items]  # users: a DataFrame, or a table on the driver
            rule = P.split_rule(totals, cfg, counts)
            P.users_by_partition(users, work)
            item_table = P.split_positives(spark, work, items, rule, progress, counts)
            pop = item_table[S.POP_TRAIN].to_numpy()
            warm_users = counts["users"] - counts["cold_users"]
            train_pos = int(pop.sum())
            z = rstar_z(cfg.rstar_z, warm_users, train_pos)
            rstar_item = rstar_per_item(pop, z, cfg.beta)
            counts.update(warm_users=warm_users, train_positives_warm=train_pos, rstar_z=z)

            W.write_items(item_table, f"{tmp}/{S.ITEMS_DIR}")
            user_files = W.write_users(users, f"{tmp}/{S.USERS_DIR}", partitions, counts["users"])
            progress.done("tables", items=len(item_table), users=counts["users"],
                          user_files=user_files)

            if cfg.negatives and train_pos == 0:
                raise InputDataError("no training positives among warm users; lower --cold-users")
            shards = W.write_user_rows(spark, work, f"{tmp}/{S.ROWS_DIR}", f"{tmp}/{S.SPLIT_DIR}",
                                       rstar_item, pop, cfg)
            publisher.delete(work.root)
            progress.done("write", users=sum(s["users"] for s in shards), shards=len(shards),
                          positives=sum(counts["positives"].values()),
                          mib=round(sum(s["bytes"] for s in shards) / 2**20, 1))

            manifest = {
                "schema_version": S.SCHEMA_VERSION,
                # its name (--name) is what training, MLflow and the registry go by; its format
                # and protocol defaults are --dataset's
                "dataset": cfg.name,
                "format": cfg.dataset,
                "created": started.isoformat(timespec="seconds"),
                "code_version": code_version(),
                "inputs": inputs,
                "parameters": cfg.to_dict(),
                "counts": counts,
                "layout": {"items": S.ITEMS_DIR, "users": S.USERS_DIR, "rows": S.ROWS_DIR,
                           "split": S.SPLIT_DIR, "shards": len(shards),
                           "row_shards": shards},
                "steps": progress.steps,
                "seconds": round(time.perf_counter() - t0, 1),
                "spark": {"version": spark.version, "master": spark.sparkContext.master,
                          "shuffle_partitions": partitions},
            }
            # last: lists every file with its size and CRC-32 (the shards' from their writers)
            manifest = publisher.write_manifest(manifest, checksums={
                f"{S.ROWS_DIR}/{s['shard']}": s["crc32"] for s in shards})
    finally:
        for df in cached:
            if isinstance(df, DataFrame):
                df.unpersist()
    log.info("wrote %s in %.1fs: %s users (%s cold), %s items, positives %s",
             publisher.target, time.perf_counter() - t0, f"{counts['users']:,}",
             f"{counts['cold_users']:,}", f"{counts['items']:,}", counts["positives"])
    return manifest


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.quiet)
    try:
        cfg = config_from_args(args)
        run(cfg)
    except (UsageError, InputDataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
