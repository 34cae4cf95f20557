"""Side by side, in one run, against what a user would run instead (issue 56, item 5).

    .venv/bin/python benchmarks/alternatives.py                          # both parts, both shapes
    .venv/bin/python benchmarks/alternatives.py --parts train --shapes gowalla --widths 200 1000

train   NCE-AutoRec's training step over every warm user of the data (one epoch, the bare step of
        ``training.step.train_batch``: forward, backward, Adam, one process with all the cores,
        no Ray Data, no validation; train_throughput.py's reference) against one sweep of
        ``implicit``'s ALS (``implicit.cpu.als``, its conjugate-gradient solver, users then
        items) with as many factors as the width and the same threads, on the same positives.
        An ALS sweep is what an epoch is to the AutoRec family: the unit both train in (ALS
        converges in 10-20 sweeps, the family in 10-40 epochs here).
score   ``evaluation/score.py`` (the project's batch scoring on Spark, top K of every user with
        the input items left out) against Spark MLlib ALS ``recommendForAllUsers(K)`` with
        rank = width, written to Parquet the same way, on the same Spark session (local[2]) and
        users; and ``implicit``'s batch ``recommend`` (the same rank, its items filtered) in one
        process. The ALS fit itself is not timed (one iteration, only its factors' shapes matter).

Shapes (items, positives per user; ``--users`` synthetic users from ``spark-submit
etl/prepare.py --dataset synthetic``): Gowalla's (40,981 items, 34.4 positives a user, the real
29,858 users by default) and Yahoo's (44,865 items, 26.0). Ratios are the alternative's seconds
over ours: above 1, ours is faster. Results: ``benchmarks/results/alternatives.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import datasets, report, score_throughput  # noqa: E402

SHAPES = {  # items, positives per user (all splits; the input gets half)
    "gowalla": {"items": 40_981, "per_user": 34.4},
    "yahoo": {"items": 44_865, "per_user": 26.0},
}
K, BATCH, ALPHA = 50, 2048, 20.0
REPEATS = 3  # each training side's time is the least of 3


def prepare(shape: str, users: int, work: Path) -> Path:
    s = SHAPES[shape]
    return datasets.synthetic(s["items"], s["per_user"], users, work / f"syn-{shape}-{users}")


def train_rows(data: Path) -> list:
    import pandas as pd
    return list(pd.read_parquet(data / "rows", columns=["train_items"])["train_items"])


def csr(rows: list, n_items: int):
    """Users x items CSR of ones (implicit's input)."""
    from models.batch import sparse_rows, to_csr
    return to_csr(*sparse_rows(rows), n_items)


def autorec_epoch_seconds(data: Path, width: int) -> float:
    """Seconds of one pass of the bare NCE-AutoRec step over every warm user (after 2 warm-up
    steps), batch ``BATCH``, all the cores."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    from models.registry import MODELS as REGISTRY
    from prepared import schema as S
    from prepared.reader import open_prepared
    from training import feed as F
    from training.config import TrainConfig
    from training.loop import build_model
    from training.step import make_optimizers, train_batch

    torch.set_num_threads(os.cpu_count() or 1)
    prep = open_prepared(str(data))
    cfg = TrainConfig(data=str(data), model="nce-autorec", width=width, batch_size=BATCH)
    make = F.BatchMaker(F.plan(REGISTRY["nce-autorec"], prep, cfg))
    table = pq.read_table(prep.rows_uri)
    table = table.filter(pc.invert(table[S.COLD]))
    net, policy = build_model(cfg, prep.n_items, prep.n_users,
                              REGISTRY["nce-autorec"].trainer.data_statistics(prep))
    phase = policy.phases()[0]
    opts = make_optimizers(policy, phase, 1e-3)
    for i in range(2):  # warm-up: first-touch pages, the allocator, oneDNN's kernels
        train_batch(net, make(table.slice(i * BATCH, BATCH), 0), phase, opts)

    def epoch():
        for lo in range(0, len(table), BATCH):  # batches built inside the timing, as an epoch
            train_batch(net, make(table.slice(lo, BATCH), 0), phase, opts)
    return min(timed(epoch) for _ in range(REPEATS))


def als(factors: int, iterations: int = 1):
    from implicit.cpu.als import AlternatingLeastSquares
    return AlternatingLeastSquares(factors=factors, iterations=iterations, regularization=0.01,
                                   alpha=ALPHA, use_cg=True, num_threads=os.cpu_count() or 1,
                                   calculate_training_loss=False, random_state=0)


def als_sweep_seconds(rows: list, n_items: int, factors: int) -> float:
    """Seconds of one ALS sweep (users, then items) of implicit's, the least of ``REPEATS``
    after one untimed sweep (its thread pool and first touches)."""
    from threadpoolctl import threadpool_limits
    user_items = csr(rows, n_items)
    # untimed, and before the limit: the first fit loads a BLAS that a limit entered earlier
    # does not reach, which then runs threads of its own beside implicit's (4.3x slower here)
    als(factors).fit(user_items, show_progress=False)
    with threadpool_limits(1, "blas"):  # implicit's advice: its threads, not BLAS's
        return min(timed(lambda: als(factors).fit(user_items, show_progress=False))
                   for _ in range(REPEATS))


def train_part(shape: str, data: Path, widths: list[int]) -> list[dict]:
    rows = train_rows(data)
    out = []
    for width in widths:
        ours = autorec_epoch_seconds(data, width)
        theirs = als_sweep_seconds(rows, SHAPES[shape]["items"], width)
        out.append({"part": "train", "shape": shape, "users": len(rows), "width": width,
                    "ours": f"NCE-AutoRec epoch (bare step, batch {BATCH})",
                    "ours_seconds": round(ours, 2),
                    "theirs": "implicit ALS sweep (cg)", "theirs_seconds": round(theirs, 2),
                    "ratio": round(theirs / ours, 3)})
        print(out[-1], flush=True)
    return out


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def mllib_als(spark, rows: list, width: int):
    """A Spark MLlib ALSModel of rank ``width`` on these positives (one iteration: only its
    factors' shapes matter to scoring)."""
    from pyspark.ml.recommendation import ALS
    pairs = [(u, int(i)) for u, r in enumerate(rows) for i in r]
    df = spark.createDataFrame(pairs, "user int, item int").selectExpr("*", "1.0 as rating")
    return ALS(rank=width, maxIter=1, implicitPrefs=True, alpha=ALPHA, userCol="user",
               itemCol="item", ratingCol="rating", coldStartStrategy="drop",
               seed=0).fit(df.repartition(2))


def score_part(spark, shape: str, data: Path, widths: list[int], work: Path) -> list[dict]:
    rows = train_rows(data)
    out = []
    for width in widths:
        out += score_width(spark, shape, data, rows, width, work)
    return out


def score_width(spark, shape: str, data: Path, rows: list, width: int, work: Path) -> list[dict]:
    """Our scoring's warm call against MLlib's and implicit's at one width (see the docstring)."""
    from threadpoolctl import threadpool_limits

    from evaluation.score import score

    run = score_throughput.save_model(data, work, width)

    def ours():
        score(spark, model=str(run), data=str(data), output=str(work / f"recs-{shape}-{width}"),
              k=K, overwrite=True)

    model = mllib_als(spark, rows, width)

    def mllib():
        model.recommendForAllUsers(K).write.mode("overwrite").parquet(
            str(work / f"als-{shape}-{width}"))

    fitted = als(width, iterations=1)
    user_items = csr(rows, SHAPES[shape]["items"])
    fitted.fit(user_items, show_progress=False)  # before the limit (als_sweep_seconds says why)

    def implicit_recommend():
        fitted.recommend(list(range(len(rows))), user_items, N=K,
                         filter_already_liked_items=True)

    seconds = {}
    with threadpool_limits(1, "blas"):
        for name, fn in (("ours", ours), ("mllib", mllib), ("implicit", implicit_recommend)):
            fn()  # a warm call is the one reported, as score_throughput's
            seconds[name] = timed(fn)  # one: MLlib's takes about a minute
    out = []
    for key, name in (("mllib", "Spark MLlib ALS recommendForAllUsers"),
                      ("implicit", "implicit ALS recommend (one process)")):
        out.append({"part": "score", "shape": shape, "users": len(rows), "width": width,
                    "ours": "evaluation/score.py (Spark local[2])",
                    "ours_seconds": round(seconds["ours"], 2), "theirs": name,
                    "theirs_seconds": round(seconds[key], 2),
                    "ratio": round(seconds[key] / seconds["ours"], 3)})
        print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--parts", nargs="+", default=["train", "score"], choices=["train", "score"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--widths", nargs="+", type=int, default=[200],
                   help="AutoRec widths = ALS factors (default 200)")
    p.add_argument("--users", type=int, default=29_858, help="synthetic users per shape")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "alternatives"))
    p.add_argument("--work", default=None, help="keep the generated data here (reused)")
    args = p.parse_args(argv)
    st = report.stamp("alternatives.py", argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="alternatives-") as w:
        work = Path(args.work or w)
        work.mkdir(parents=True, exist_ok=True)
        datas = {s: prepare(s, args.users, work) for s in args.shapes}
        if "train" in args.parts:
            for shape, data in datas.items():
                rows += train_part(shape, data, args.widths)
        if "score" in args.parts:
            os.environ.setdefault("SPARK_MASTER", "local[2]")
            from runtime.spark import get_spark
            spark = get_spark("alternatives")
            try:
                for shape, data in datas.items():
                    rows += score_part(spark, shape, data, args.widths, work)
            finally:
                spark.stop()
    write(rows, st, args)
    return 0


def write(rows: list[dict], st: dict, args) -> None:
    lines = ["# Against what a user would run instead (issue 56, item 5)", "",
             f"Command: `{st['command']}`  ", f"Machine: {st['machine']}; {st['date']}.  ",
             f"{args.users:,} synthetic users per shape (spark-submit etl/prepare.py --dataset "
             f"synthetic at the shape's items and positives per user); top {K}; ALS alpha "
             f"{ALPHA:g}. Ratio: the alternative's seconds over ours (above 1: ours is faster). "
             "benchmarks/alternatives.py's docstring says what each side includes.", "",
             "| part | shape | width / factors | ours | s | alternative | s | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['part']} | {r['shape']} | {r['width']} | {r['ours']} | "
                     f"{r['ours_seconds']:.1f} | {r['theirs']} | {r['theirs_seconds']:.1f} | "
                     f"{r['ratio']:.2f} |")
    report.publish(Path(args.out), {**st, "users_per_shape": args.users, "k": K,
                                    "results": rows}, lines)


if __name__ == "__main__":
    sys.exit(main())
