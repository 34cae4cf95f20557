"""Top-K recommendations for every user of a prepared dataset, on Spark.

    spark-submit evaluation/score.py --model runs:/RUN_ID/model --data DIR --output RECS --k 50
    spark-submit evaluation/score.py --model var/runs/NAME --data DIR --output RECS --users cold
    spark-submit evaluation/score.py --model URI1 URI2 --data DIR --output RECS1 RECS2

Several models, each with its own --output in the same order, are scored one after another in
one Spark application (one start-up instead of one per model); each output is published on its
own, so a failure part-way leaves the models already scored complete.

Writes Parquet with one row per user: ``user_id`` (raw id, string), ``item_ids`` (raw ids, best
first, list<string>) and ``scores`` (list<float>), published atomically: RECS appears complete
(with ``_manifest.json``, which Parquet readers skip) or not at all.

One task per shard of the prepared rows: it reads the shard with pyarrow, rebuilds the model
once from broadcast weights, scores Arrow batches of its users with ``torch.set_num_threads`` =
the task's cores, removes the user's input items, keeps the top K and writes the lists to the file
named as the shard (``part-00007.parquet`` holds the users of ``rows/part-00007.parquet``; the
manifest's ``row_shards`` records which rows, by CRC-32, so evaluation can read a file beside its
shard without a shuffle). Users are never collected to the driver, and a batch is sized so its
(users x items) score matrix stays near 64 MiB, so memory per task is bounded whatever the
number of users.

Model input: a warm user's rows of the splits the model was trained on (train, or train+valid for
the protocol's final retraining); a cold-start user's train part (their fold-in input; their
valid+test parts are the ground truth). ``--exclude`` removes more splits from the candidates,
e.g. ``--exclude train,valid`` when scoring the test split with a model trained on train only.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (spark-submit evaluation/score.py)
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import datetime as dt
import json
import logging
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from prepared import schema as S
from prepared.errors import UsageError
from prepared.lists import list_offsets
from prepared.protocol import TOP_K
from runtime.cli import add_options, option, strict_parser, values
from runtime.progress import EVERY, info_lines, spark_progress
from runtime.spark import broadcast_room, check_broadcast, shard_tasks

log = logging.getLogger("evaluation")

MARKER = "_manifest.json"      # Spark and pyarrow skip names starting with "_"
SCORE_BYTES = 64 * 2**20       # per batch: users x items float32 scores
OUT_SCHEMA = pa.schema([("user_id", pa.string()), ("item_ids", pa.list_(pa.string())),
                        ("scores", pa.list_(pa.float32()))])
SHARDS_SCHEMA = "shard string, users long, bytes long, crc32 string"
SPLIT_NAMES = {"train": S.TRAIN_ITEMS, "valid": S.VALID_ITEMS, "test": S.TEST_ITEMS}


def batch_users(n_items: int) -> int:
    """Users per Arrow batch so that one batch's score matrix stays near ``SCORE_BYTES``."""
    return int(max(16, min(8192, SCORE_BYTES // (4 * n_items))))


def parse_splits(text: str, flag: str) -> tuple[str, ...]:
    splits = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in splits if s not in SPLIT_NAMES]
    if bad or not splits:
        raise UsageError(f"{flag} {text!r}: give a comma-separated list of train, valid, test")
    return splits


# ---- executor side ---------------------------------------------------------------------------

_CACHE: dict = {}  # one model per Python worker and scoring job (workers are reused across tasks)


def _model(key: str, bc_weights, model: str, model_args: dict):
    """The job's model, built once per Python worker. ``key`` is unique per ``score`` call: a
    worker that served an earlier job must not reuse that job's model (broadcast objects carry no
    id on the executors, and Python object ids are recycled)."""
    from evaluation.model_source import build

    if _CACHE.get("key") != key:
        _CACHE.clear()  # drop the previous model before building the next
        _CACHE.update(key=key, model=build(bc_weights.value, model, model_args))
    return _CACHE["model"]


def union_rows(rb: pa.RecordBatch, cols: tuple[str, ...], cold: np.ndarray,
               cold_cols: tuple[str, ...]):
    """(items, offsets), int64 torch tensors in EmbeddingBag layout: each user's items of ``cols``
    (a cold user's only of the columns whose ``cold_cols`` entry is non-empty). A user's splits are
    disjoint, so concatenating them is their union."""
    import torch

    from models.batch import flat

    n = rb.num_rows
    values, owners = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for col, cold_col in zip(cols, cold_cols):
        v, off = flat(rb.column(col))
        owner = np.repeat(np.arange(n), np.diff(np.append(off, len(v))))
        if not cold_col:
            keep = ~cold[owner]
            v, owner = v[keep], owner[keep]
        values.append(v.astype(np.int64))
        owners.append(owner)
    owner = np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    offsets = np.zeros(n, np.int64)
    np.cumsum(np.bincount(owner, minlength=n)[:-1], out=offsets[1:])
    return torch.from_numpy(np.concatenate(values)[order]), torch.from_numpy(offsets)


def score_batches(batches, *, key: str, bc_weights, bc_item_ids, model: str, model_args: dict, k: int,
                  input_cols: tuple[str, ...], exclude_cols: tuple[str, ...],
                  cold_input_cols: tuple[str, ...], cold_exclude_cols: tuple[str, ...]):
    """mapInArrow body: Arrow batches of user rows -> (user_id, item_ids, scores) batches."""
    import torch
    from pyspark import TaskContext

    ctx = TaskContext.get()
    torch.set_num_threads(max(1, int(ctx.cpus())) if ctx else 1)
    net = _model(key, bc_weights, model, model_args)
    item_ids = bc_item_ids.value
    for rb in batches:
        if rb.num_rows == 0:
            continue
        cold = rb.column(S.COLD).to_numpy(zero_copy_only=False)
        items, offsets = union_rows(rb, input_cols, cold, cold_input_cols)
        ex_items, ex_offsets = union_rows(rb, exclude_cols, cold, cold_exclude_cols)
        values, indices = net.recommend(items, offsets, k, exclude=(ex_items, ex_offsets))
        vals, idx = values.numpy(), indices.numpy()
        keep = np.isfinite(vals)  # a user with fewer than K candidates: drop the excluded tail
        lengths = keep.sum(axis=1)
        out_items = item_ids.take(pa.array(idx[keep]))
        yield pa.RecordBatch.from_arrays(
            [rb.column(S.USER_ID).cast(pa.string()),
             pa.ListArray.from_arrays(list_offsets(lengths), out_items),
             pa.ListArray.from_arrays(list_offsets(lengths), pa.array(vals[keep], pa.float32()))],
            names=["user_id", "item_ids", "scores"])


def pick_users(table: pa.Table, spec: str, ids: frozenset[str] | None) -> pa.Table:
    """The rows of ``table`` that ``--users spec`` selects (``select_users``' choice, in pyarrow)."""
    import pyarrow.compute as pc

    if spec in ("warm", "cold"):
        return table.filter(pc.equal(table.column(S.COLD), spec == "cold"))
    if ids is not None:
        return table.filter(pc.is_in(table.column(S.USER_ID).cast(pa.string()),
                                     value_set=pa.array(sorted(ids), pa.string())))
    return table


def score_shards_fn(rows_uri: str, out_uri: str, columns: list[str], users: str,
                    ids: frozenset[str] | None, per_batch: int, score_kwargs: dict):
    """mapInArrow body: rows of (shard) names -> one output file per shard, named as the rows
    shard it scores (``{shard, users, bytes, crc32}`` per shard).

    The shard is read and the lists written by pyarrow in the Python worker: a user's row and
    list then sit in files of the same name, which is what lets evaluation read the two side by
    side without a shuffle (``evaluation/user_table.py``), and the JVM never converts the rows'
    item lists to Arrow and the lists back. A retried task rewrites the same file; the directory
    is published whole."""
    def fn(batches):
        import pyarrow.parquet as pq

        from prepared.files import Crc32Sink, crc32_hex
        from prepared.uri import filesystem, join

        fs_in, root_in = filesystem(rows_uri)
        fs_out, root_out = filesystem(out_uri)
        fs_out.create_dir(root_out, recursive=True)  # the staging directory: no Spark writer made it
        for b in batches:
            for shard in b.column("shard").to_pylist():
                table = pick_users(pq.read_table(join(root_in, shard), columns=columns,
                                                 filesystem=fs_in), users, ids)
                path = join(root_out, shard)
                n_users, sink = 0, Crc32Sink(fs_out.open_output_stream(path))
                try:  # the writer leaves a file object it was given open
                    with pq.ParquetWriter(sink, OUT_SCHEMA) as w:
                        for rb in score_batches(table.to_batches(max_chunksize=per_batch),
                                                **score_kwargs):
                            w.write_batch(rb)
                            n_users += rb.num_rows
                finally:
                    sink.close()
                yield pa.RecordBatch.from_pydict({
                    "shard": [shard], "users": [n_users], "bytes": [fs_out.get_file_info(path).size],
                    "crc32": [crc32_hex(sink.crc)]})

    return fn


# ---- driver side -----------------------------------------------------------------------------

def read_user_ids(spec: str) -> list[str]:
    """``@FILE`` (one raw user id per line) or a comma-separated list."""
    if spec.startswith("@"):
        path = Path(spec[1:])
        if not path.exists():
            raise UsageError(f"--users {spec}: no such file {path}")
        ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    else:
        ids = [s.strip() for s in spec.split(",") if s.strip()]
    if not ids:
        raise UsageError(f"--users {spec!r}: no user ids given")
    return ids


def select_users(rows, spec: str, source: str):
    from pyspark.sql import functions as F

    if spec == "all":
        return rows
    if spec in ("warm", "cold"):
        return rows.filter(F.col(S.COLD) == (spec == "cold"))
    ids = read_user_ids(spec)
    chosen = rows.filter(F.col(S.USER_ID).isin(ids))
    found = {r[0] for r in chosen.select(S.USER_ID).collect()}  # at most len(ids) rows
    missing = [u for u in ids if u not in found]
    if missing:
        raise UsageError(f"--users: {len(missing)} of {len(ids)} user ids are not in {source}, "
                         f"e.g. {', '.join(missing[:5])}; ids are the raw ids of the dataset")
    return chosen


@dataclass(frozen=True)
class ScoreConfig:
    """One scoring job; evaluation/score.py's flags are built from these fields (``runtime.cli``)."""

    model: str = option(help="MLflow model URI (runs:/RUN_ID/model, models:/m-..., "
                             "models:/NAME@ALIAS) or a training run's model.pt / run directory")
    data: str = option(help="the prepared directory the model was trained on")
    output: str = option(help="the recommendations' Parquet directory itself: its files go "
                              "directly in OUTPUT (local path or URI)")
    k: int = option(TOP_K, help="recommendations per user (the protocol's top list)")
    users: str = option("all", help="all, warm, cold, a comma-separated list of raw user ids, or "
                                    "@FILE with one id per line")
    exclude: str | None = option(None, help="more splits to remove from the candidates besides "
                                            "the model's input splits, e.g. train,valid (default: "
                                            "the input splits only)")
    mlflow_uri: str | None = option(None, help="tracking server of an MLflow --model (default: "
                                               "MLFLOW_TRACKING_URI, else ./mlflow/state)")
    overwrite: bool = option(False, help="replace an existing --output")


def score(spark, progress_every: float = EVERY, **kwargs) -> dict:
    """Score with the ``ScoreConfig`` of ``kwargs`` (the flags' names): ``users`` of the prepared
    ``data`` with ``model``, publish ``output``; returns the scoring manifest (also written as
    ``output/_manifest.json``). While the users are scored, a progress line every
    ``progress_every`` seconds (tasks and users done, rate, time left) on the INFO log. One
    function although long: the checks, the model's broadcast and the scoring job share one
    staging directory and one manifest, written last."""
    cfg = ScoreConfig(**kwargs)
    model, data, output, k, users = cfg.model, cfg.data, cfg.output, cfg.k, cfg.users
    exclude, overwrite, mlflow_uri = cfg.exclude, cfg.overwrite, cfg.mlflow_uri
    from evaluation.model_source import load_source
    from prepared.reader import open_prepared
    from runtime.publish import Publisher

    t0 = time.perf_counter()
    if k < 1:
        raise UsageError(f"--k {k}: must be at least 1")
    prep = open_prepared(data)
    if k > prep.n_items:  # a list longer than the catalogue: every item, in a file per user
        raise UsageError(f"--k {k}: --data {data} has {prep.n_items:,} items; a list can hold "
                         f"at most that many (the paper's metrics use 50)")
    src = load_source(model, mlflow_uri)
    if src.n_items != prep.n_items:
        raise UsageError(f"--model {model} scores {src.n_items:,} items but --data {data} has "
                         f"{prep.n_items:,}: the model was trained on another prepared dataset; "
                         "score it against the directory it was trained on")
    check_broadcast(len(src.weights), broadcast_room(spark), f"--model {model}'s weights")
    input_splits = parse_splits(src.train_splits, "the model's training splits")
    excl = tuple(dict.fromkeys(input_splits + (parse_splits(exclude, "--exclude") if exclude else ())))
    publisher = Publisher(spark, output, marker=MARKER)
    publisher.check_target(overwrite)

    items = spark.read.parquet(f"{prep.uri}/{prep.manifest['layout']['items']}") \
        .select(S.ITEM_INDEX, S.ITEM_ID).toPandas().sort_values(S.ITEM_INDEX)
    bc_item_ids = spark.sparkContext.broadcast(pa.array(items[S.ITEM_ID].astype(str).tolist(),
                                                        pa.string()))
    bc_weights = spark.sparkContext.broadcast(src.weights)
    columns = sorted({SPLIT_NAMES[s] for s in ("train",) + input_splits + excl})
    # which users, and how many: a small job over two columns, before any scoring
    n_users = select_users(spark.read.parquet(prep.rows_uri).select(S.USER_ID, S.COLD), users,
                           data).count()  # one output row per input user
    if n_users == 0:
        raise UsageError(f"--users {users}: no such users in {data} (is --cold-users 0 there?)")
    per_batch = batch_users(prep.n_items)
    shards = prep.row_shards()

    # cold users: input train only, exclude train only (their valid+test parts are the truth)
    cold_in = tuple(c if c == S.TRAIN_ITEMS else "" for c in map(SPLIT_NAMES.get, input_splits))
    cold_ex = tuple(c if c == S.TRAIN_ITEMS else "" for c in map(SPLIT_NAMES.get, excl))
    fn_kwargs = dict(key=uuid.uuid4().hex, bc_weights=bc_weights, bc_item_ids=bc_item_ids,
                     model=src.model, model_args=src.model_args, k=k,
                     input_cols=tuple(SPLIT_NAMES[s] for s in input_splits),
                     exclude_cols=tuple(SPLIT_NAMES[s] for s in excl),
                     cold_input_cols=cold_in, cold_exclude_cols=cold_ex)
    ids = None if users in ("all", "warm", "cold") else frozenset(read_user_ids(users))
    log.info("scoring %s %s users of %s with %s (%s, %s items, top %d, input %s, excluding %s); "
             "%d users per batch", f"{n_users:,}", users, prep.dataset, src.name, src.model,
             f"{prep.n_items:,}", k, "+".join(input_splits), "+".join(excl), per_batch)
    started = dt.datetime.now(dt.UTC)
    try:
        with publisher.staging() as tmp:
            with spark_progress(spark, "scoring", every=progress_every, total_users=n_users,
                                log=info_lines(log)):
                # one task per rows shard, writing the file of the same name (score_shards_fn)
                written = shard_tasks(spark, shards).mapInArrow(score_shards_fn(
                    prep.rows_uri, tmp, [S.USER_ID, S.COLD, *columns], users, ids, per_batch,
                    fn_kwargs), SHARDS_SCHEMA).collect()
            seconds = time.perf_counter() - t0
            manifest = {
                "kind": "recommendations", "created": started.isoformat(timespec="seconds"),
                "model": model, "model_name": src.name, "model_kind": src.model,
                "model_args": src.model_args, "mlflow_run_id": src.run_id,
                "mlflow_uri": src.tracking_uri, "data": prep.uri, "dataset": prep.dataset,
                "k": k, "users": users, "input_splits": list(input_splits),
                "exclude": list(excl), "scored_users": n_users, "seconds": round(seconds, 1),
                "columns": {"user_id": "string", "item_ids": "list<string>",
                            "scores": "list<float>"},
                # file f holds the users of the rows shard f, whose CRC-32 is given: evaluation
                # pairs them without a shuffle while the prepared data is the same
                "row_shards": shards,
            }
            manifest = publisher.write_manifest(  # last: lists every file, marks completeness
                manifest, checksums={r["shard"]: r["crc32"] for r in written})
    finally:
        # destroy, not unpersist: unpersist drops the executors' copies only, and the driver
        # keeps every model's weights until its heap runs out (an experiment scores 39 models in
        # one application: citeulike-a's EASE, 1.15 GB, failed after NCE-PLRec's rank-4000 ones)
        bc_weights.destroy()
        bc_item_ids.destroy()
    log.info("wrote %s: %s users in %.1fs (%.0f users/s)", publisher.target, f"{n_users:,}",
             seconds, n_users / max(seconds, 1e-9))
    return manifest


def build_parser() -> argparse.ArgumentParser:
    p = strict_parser(prog="evaluation/score.py", formatter_class=argparse.RawDescriptionHelpFormatter,
                      description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    add_options(p, ScoreConfig)
    for action in p._actions:  # one scoring job's fields, given once per model
        if action.dest in ("model", "output"):
            action.nargs, action.metavar = "+", action.dest.upper()
            action.help += " (several: one per model, in the same order)"
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    return p


def jobs(args: argparse.Namespace) -> list[dict]:
    """One ``score`` call's arguments per --model, paired with its --output."""
    models, outputs = list(args.model), list(args.output)
    if len(models) != len(outputs):
        raise UsageError(f"--model names {len(models)} model{'s' * (len(models) > 1)} but "
                         f"--output {len(outputs)} director{'ies' if len(outputs) > 1 else 'y'}: "
                         "give one --output per --model, in the same order")
    if len(set(outputs)) != len(outputs):
        raise UsageError("--output names one directory twice: each model needs its own")
    base = values(args, ScoreConfig)
    return [{**base, "model": m, "output": o} for m, o in zip(models, outputs)]


def main(argv: list[str] | None = None) -> int:
    from prepared.verify import naming_damaged_files
    from runtime.logs import setup_logging
    from runtime.spark import get_spark

    args = build_parser().parse_args(argv)
    setup_logging(args.quiet, ("etl", "evaluation"))
    try:
        todo = jobs(args)
        spark = get_spark("score")
        for job in todo:
            with naming_damaged_files(args.data):  # a shard that fails to read: named in one line
                m = score(spark, **job)
            print(json.dumps({"output": job["output"], "scored_users": m["scored_users"],
                              "seconds": m["seconds"]}), flush=True)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # spark-submit runs this file as __main__, whose functions cloudpickle ships to the executors
    # by value, each task with a fresh _CACHE: every task then rebuilt the model (98 builds at the
    # Yahoo shape, ~10% of the workers' time). The importable module's functions travel by
    # reference, and each Python worker keeps its model across tasks.
    from evaluation.score import main as module_main

    sys.exit(module_main())
