"""Batch size and learning rate of the AutoRec family, now that a large batch is cheap: validation
NDCG and the time to reach it, against the current defaults, on real data.

    .venv/bin/python benchmarks/batch_defaults.py [--datasets ml-100k,ml-latest-small]
                                                  [--models autorec,nce-autorec]

With the exact fast losses (models/autorec/losses.py) a step costs O(n d^2) whatever the batch, and every
step also pays Adam over the n x d matrices, so the time of an epoch falls with the batch size;
what may fall with it is the quality (fewer, larger steps). Each dataset is prepared by the real
ETL (benchmarks/baselines.py); each (model, batch, lr) trains in this process with the trainer's
steps and early stopping (``benchmarks/tune_defaults.train_one``), lambda at the value the
comparison table chose for that model and dataset, width 200, joint mode. Reported: the best
validation NDCG as a fraction of the reference's (batch 128, lr 3e-4: the defaults until now), the
seconds to the best epoch, and the speed-up. ``--check-dense`` also trains the largest batch
through the dense scores (the same maths): its curve must match the fast one's within noise.
Results: ``benchmarks/results/batch_defaults.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.baselines import prepare  # noqa: E402
from benchmarks.tune_defaults import load, train_one  # noqa: E402
from models.autorec import AutoRec  # noqa: E402
from training.config import TrainConfig  # noqa: E402

REFERENCE = (128, 3e-4)
POINTS = [REFERENCE, (512, 1e-3), (512, 3e-3), (1024, 1e-3), (1024, 3e-3), (2048, 3e-3),
          (2048, 1e-2)]
EPOCHS = 400  # a cap: early stopping ends the runs (a large batch takes more, cheaper, epochs)
TABLE = ROOT / "benchmarks" / "results" / "baselines.json"


def chosen_lambda(dataset: str, model: str) -> float:
    rows = json.loads(TABLE.read_text())["results"].get(dataset, {}).get("models", {})
    return rows[model]["best"]["hp"]["lam"] if model in rows else 30.0


def run(cfg: TrainConfig, prep, rows, valid, dense: bool | None = None) -> dict:
    AutoRec.dense_loss = dense  # None: the model's own choice per batch
    try:
        r = train_one(cfg, prep, rows, valid)
    finally:
        AutoRec.dense_loss = None
    to_best = next(s for s, n in r["curve"] if n == r["best_ndcg"])
    return {"best_ndcg": r["best_ndcg"], "best_epoch": r["best_epoch"], "epochs": r["epochs"],
            "seconds": r["seconds"], "seconds_to_best": to_best, "curve": r["curve"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default="ml-100k,ml-latest-small")
    p.add_argument("--models", default="autorec,nce-autorec")
    p.add_argument("--check-dense", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "batch_defaults"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="batch-defaults-", dir=ROOT / "var"))
    results = []
    for name in args.datasets.split(","):
        data = str(prepare(name, Path(args.shared), work))
        prep, rows, valid = load(data)
        for model in args.models.split(","):
            lam = chosen_lambda(name, model)
            for batch, lr in POINTS:
                cfg = TrainConfig(data=data, model=model, batch_size=batch, lr=lr, lam=lam,
                                  epochs=EPOCHS)
                ways = ["default"] + (["dense"] if args.check_dense and batch == POINTS[-1][0]
                                      and lr == POINTS[-1][1] else [])
                for way in ways:
                    r = {"dataset": name, "model": model, "batch": batch, "lr": lr, "lam": lam,
                         "way": way, **run(cfg, prep, rows, valid, True if way == "dense" else None)}
                    results.append(r)
                    print(f"{name} {model} batch {batch} lr {lr:g} ({way}): best NDCG "
                          f"{r['best_ndcg']:.4f} at epoch {r['best_epoch']}, "
                          f"{r['seconds_to_best']:.1f}s to it, {r['seconds']:.1f}s in all", flush=True)
            write(results, args)
    return 0


def write(results: list[dict], args) -> None:
    stamp = {**report.stamp("batch_defaults.py"), "epochs_cap": EPOCHS, "reference": REFERENCE}
    lines = ["# Batch size and learning rate of the AutoRec family: quality against time\n",
             f"Command: `{stamp['command']}`  ", f"Machine: {stamp['machine']}; {stamp['date']}.  ",
             f"Width 200, joint mode, lambda as chosen in baselines.md, early stopping (patience "
             f"5, at most {EPOCHS} epochs), one process. Fraction: best validation NDCG / the "
             f"reference's (batch {REFERENCE[0]}, lr {REFERENCE[1]:g}); speed-up: the "
             "reference's seconds to its best epoch / this one's. 'dense': the same run through "
             "the dense scores.\n",
             "| dataset | model | batch | lr | way | best NDCG | fraction | best epoch | s to best "
             "| speed-up |", "|---|---|---|---|---|---|---|---|---|---|"]
    ref = {(r["dataset"], r["model"]): r for r in results
           if (r["batch"], r["lr"]) == REFERENCE and r["way"] == "default"}
    for r in results:
        base = ref.get((r["dataset"], r["model"]))
        frac = f"{r['best_ndcg'] / base['best_ndcg']:.3f}" if base else "-"
        speed = f"{base['seconds_to_best'] / max(r['seconds_to_best'], 1e-9):.1f}x" if base else "-"
        lines.append(f"| {r['dataset']} | {r['model']} | {r['batch']} | {r['lr']:g} | {r['way']} | "
                     f"{r['best_ndcg']:.4f} | {frac} | {r['best_epoch']} | "
                     f"{r['seconds_to_best']:.1f} | {speed} |")
    report.publish(Path(args.out), {**stamp, "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
