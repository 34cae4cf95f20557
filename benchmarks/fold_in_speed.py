"""What the fold-in of BPR, CML and CDAE costs, the fast way against the plain one, in one run.

    .venv/bin/python benchmarks/fold_in_speed.py [--datasets ml-100k,citeulike-a] [--models bpr,cml,cdae]

A per-user model scores every user by a fold-in (models/peruser.py), and training validates every
warm user by it each epoch, so on a large catalogue the fold-in is most of a run's time. Each
dataset is prepared by the real ETL (benchmarks/datasets.py); each model at its defaults
(seeded initial weights: the cost does not depend on the values) validates every warm user with a
validation item (``training.closed_form.validate``: chunks of 1024 users, fold-in, top 50) three
ways, in this process:

    dense       every user's product with every item each step, all of a chunk at once
                (``peruser.dense_dots``: the reference, and the way before the fast one)
    gathered    the row's and the draws' item vectors gathered once (``peruser.frozen_dots``),
                one block
    blocked     gathered, users in cache-sized blocks (``peruser.in_blocks``)
    default     what ``peruser.fold_rows`` picks (blocked where gathering is cheaper, else dense)

Reported: seconds per validation, the ratio to dense, and the validation NDCG of each (equal up to
float rounding). Results: ``benchmarks/results/fold_in_speed.{json,md}``.
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

import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.datasets import prepare  # noqa: E402
from benchmarks.tune_defaults import load  # noqa: E402
from models import peruser  # noqa: E402
from models.registry import MODELS  # noqa: E402
from training.closed_form import validate  # noqa: E402
from training.config import TrainConfig  # noqa: E402

DEFAULT = (peruser.GATHER_COST, peruser.FOLD_BLOCK_FLOATS)
WAYS = {"dense": (1 << 62, 0), "gathered": (0, 1 << 62), "blocked": (0, DEFAULT[1]),
        "default": DEFAULT}  # way -> (GATHER_COST, FOLD_BLOCK_FLOATS)


def timed(model, rows, way: str) -> tuple[float, float]:
    """(seconds, validation NDCG) of one validation of every warm user, the fold-in done ``way``."""
    peruser.GATHER_COST, peruser.FOLD_BLOCK_FLOATS = WAYS[way]
    try:
        t0 = time.perf_counter()
        ndcg = validate(model, rows)[0]
        return time.perf_counter() - t0, ndcg
    finally:
        peruser.GATHER_COST, peruser.FOLD_BLOCK_FLOATS = DEFAULT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default="ml-100k,citeulike-a")
    p.add_argument("--models", default="bpr,cml,cdae")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fold_in_speed"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fold-in-speed-", dir=ROOT / "var"))
    results = []
    for name in args.datasets.split(","):
        prep, rows, _ = load(str(prepare(name, Path(args.shared), work)))
        for model in args.models.split(","):
            torch.manual_seed(0)
            net = MODELS[model].from_config(prep.n_items, TrainConfig(data="", model=model)
                                            .hyperparameters(), prep.n_users,
                                            MODELS[model].trainer.data_statistics(prep)).eval()
            timed(net, rows.slice(0, 64), "blocked")  # warm-up: first-call costs out of the way
            row = {"dataset": name, "model": model, "users": rows.num_rows, "items": prep.n_items}
            for way in WAYS:
                seconds, ndcg = timed(net, rows, way)
                row[way] = {"seconds": seconds, "ndcg": ndcg}
                print(f"{name} {model} {way}: {seconds:.2f}s (NDCG {ndcg:.6f})", flush=True)
            results.append(row)
    write(results, args)
    return 0


def write(results: list[dict], args) -> None:
    stamp = {**report.stamp("fold_in_speed.py"), "fold_steps": peruser.FOLD_STEPS,
             "block_floats": DEFAULT[1], "gather_cost": DEFAULT[0]}
    lines = ["# Fold-in speed: one validation of every warm user (fold-in + top 50)\n",
             f"Command: `{stamp['command']}`  ", f"Machine: {stamp['machine']}; {stamp['date']}.  ",
             f"{stamp['fold_steps']} Adam steps per fold-in; blocks of at most "
             f"{stamp['block_floats']:,} gathered floats; default: gathered where entries x "
             f"{stamp['gather_cost']} < users x items. Seconds per validation (ratio: dense / "
             "this way, higher is faster); NDCG equal up to float rounding.\n",
             "| dataset | model | users x items | dense s | gathered s (x) | blocked s (x) | "
             "default s (x) | NDCG dense / default |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = r["dense"]["seconds"]
        lines.append(f"| {r['dataset']} | {r['model']} | {r['users']:,} x {r['items']:,} | "
                     f"{d:.2f} | {r['gathered']['seconds']:.2f} ({d / r['gathered']['seconds']:.1f}x)"
                     f" | {r['blocked']['seconds']:.2f} ({d / r['blocked']['seconds']:.1f}x) | "
                     f"{r['default']['seconds']:.2f} ({d / r['default']['seconds']:.1f}x) | "
                     f"{r['dense']['ndcg']:.5f} / {r['default']['ndcg']:.5f} |")
    report.publish(Path(args.out), {**stamp, "results": results}, lines)

if __name__ == "__main__":
    sys.exit(main())
