"""How BPR, CML and CDAE serve a user: fold-in from the row against their trained user vectors.

    .venv/bin/python benchmarks/fold_in.py [--datasets ml-100k,ml-latest-small] [--models bpr,cml,cdae]

These models have a vector per training user but score every user by folding in from the input
row (models/peruser.py), so that a user they never saw (the cold-start users, a new row through
the pyfunc) is served like a known one. This measures what that costs. Each dataset is prepared by
the real ETL (benchmarks/datasets.py); each model trains with its defaults in this
process (benchmarks/tune_defaults.py's loop: the trainer's steps, early stopping on validation
NDCG, computed by fold-in); then the validation NDCG of the warm users (train input, train items
excluded, top 50) is computed from:

    trained     the user's trained vector (CDAE: its trained input node)
    fold-in K   K Adam steps from zero on the user's own loss, items frozen (the default is
                models.peruser.FOLD_STEPS)

with the seconds each takes per 1000 users. Results: ``benchmarks/results/fold_in.{json,md}``.
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

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import torch  # noqa: E402

from benchmarks.datasets import prepare  # noqa: E402
from benchmarks.report import publish, stamp  # noqa: E402
from benchmarks.tune_defaults import load, train_one  # noqa: E402
from models.peruser import FOLD_STEPS  # noqa: E402
from prepared import schema as S  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.feed import valid_batch  # noqa: E402
from training.validate import batch_metrics  # noqa: E402

STEPS = (15, 30, FOLD_STEPS, 120)
CHUNK = 1024  # users scored at once


def ndcg_of(model, rows: pa.Table, how) -> tuple[float, float]:
    """(validation NDCG, seconds per 1000 users) of the warm users of ``rows`` with a validation
    item, scored by ``how``: "trained", or a number of fold-in steps."""
    keep = pc.greater(pc.list_value_length(rows.column(S.VALID_ITEMS)).fill_null(0), 0)
    rows = rows.filter(keep)
    total, seconds = 0.0, 0.0
    for lo in range(0, rows.num_rows, CHUNK):
        part = rows.slice(lo, CHUNK)
        vb = valid_batch(part, 0, 1)
        users = torch.from_numpy(part.column(S.USER_INDEX).to_numpy().astype(np.int64))
        t0 = time.perf_counter()
        with torch.no_grad():
            u = (model.users(users) if how == "trained"
                 else model.fold_in(vb.train_items, vb.train_offsets, steps=how))
            scores = model.score_users(u, vb.train_items, vb.train_offsets)
        seconds += time.perf_counter() - t0
        total += float(batch_metrics(scores, vb)[0].sum())
    return total / rows.num_rows, 1000 * seconds / rows.num_rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default="ml-100k")
    p.add_argument("--models", default="bpr,cml,cdae")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fold_in"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fold-in-", dir=ROOT / "var"))
    results = []
    for name in args.datasets.split(","):
        data = prepare(name, Path(args.shared), work)
        prep, rows, valid = load(str(data))
        for model in args.models.split(","):
            cfg = TrainConfig(data=str(data), model=model)
            r = train_one(cfg, prep, rows, valid)
            net = r["net"]
            row = {"dataset": name, "model": model, "epochs": r["epochs"],
                   "best_epoch": r["best_epoch"], "train_seconds": r["seconds"]}
            for how in ("trained", *STEPS):
                ndcg, ms = ndcg_of(net, rows, how)
                row[str(how)] = {"ndcg": ndcg, "seconds_per_1000": ms}
                print(f"{name} {model} {how}: validation NDCG {ndcg:.4f} "
                      f"({ms:.2f} s per 1000 users)", flush=True)
            results.append(row)
    write(results, args)
    return 0


def write(results: list[dict], args) -> None:
    run = stamp("fold_in.py")
    cols = ["trained", *map(str, STEPS)]
    lines = ["# Fold-in against trained user vectors (validation NDCG, warm users)\n",
             f"Command: `{run['command']}`  ", f"Commit: {run['commit']}; machine: "
             f"{run['machine']}; {run['date']}.  ",
             "Each model trained with its defaults (early stopping on fold-in validation NDCG); "
             f"then scored from its trained user vectors and by fold-in with K Adam steps (the "
             f"default K is {FOLD_STEPS}). Seconds: per 1000 users, scoring included.\n",
             "| dataset | model | best epoch | " + " | ".join(
                 "trained" if c == "trained" else f"fold-in {c}" for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for r in results:
        lines.append(f"| {r['dataset']} | {r['model']} | {r['best_epoch']} | " + " | ".join(
            f"{r[c]['ndcg']:.4f} ({r[c]['seconds_per_1000']:.2f} s)" for c in cols) + " |")
    publish(Path(args.out), {**run, "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
