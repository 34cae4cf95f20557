"""Batch size and learning rate of the AutoRec family, now that a large batch is cheap: validation
NDCG and the time to reach it, against the current defaults, on real data.

    .venv/bin/python benchmarks/batch_defaults.py [--datasets ml-100k,ml-latest-small]
                                                  [--models autorec,nce-autorec]
        [--prepared citeulike-a=var/data/citeulike-a] [--points 128:3e-4,512:1e-3] [--epochs N]

With the exact fast losses (models/autorec/losses.py) a step costs O(n d^2) whatever the batch, and every
step also pays Adam over the n x d matrices, so the time of an epoch falls with the batch size;
what may fall with it is the quality (fewer, larger steps). Each dataset is prepared by the real
ETL (benchmarks/datasets.py); each (model, batch, lr) trains in this process with the trainer's
steps and early stopping (``benchmarks/tune_defaults.train_one``), lambda at the value the
comparison table chose for that model and dataset, width 200, joint mode. Reported: the best
validation NDCG as a fraction of the reference's (batch 128, lr 3e-4: the defaults until now), the
seconds to the best epoch, and the speed-up. ``--check-dense`` also trains the largest batch
through the dense scores (the same maths): its curve must match the fast one's within noise.
Results: ``benchmarks/results/batch_defaults.{json,md}``.

Runs already in the results are kept and skipped (rerun one by removing it from the .json), so
the sets can be measured in separate commands. ``--prepared NAME=DIR`` uses a prepared directory
instead of running the ETL (a synthetic set: ``etl/prepare.py --dataset synthetic``). Lambda:
the runs before 2026-11-27 took the value the former baselines.py chose (git show
6071794:benchmarks/results/baselines.md), in the plain units of their day
(``lam_units`` plain in the .json); the runs since take each model's default lambda in its
default (overlap) units, the configuration a run without flags gets, which is what the batch
and learning rate defaults are for. ``fraction`` is each run's best validation NDCG over the
best of its (dataset, model, lambda) group; the speed-up is against the reference where it ran.
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
from benchmarks.datasets import prepare  # noqa: E402
from benchmarks.tune_defaults import load, train_one  # noqa: E402
from models.autorec import AutoRec  # noqa: E402
from training.config import TrainConfig  # noqa: E402

REFERENCE = (128, 3e-4)
POINTS = [REFERENCE, (512, 1e-3), (512, 3e-3), (1024, 1e-3), (1024, 3e-3), (2048, 3e-3),
          (2048, 1e-2)]
EPOCHS = 400  # a cap: early stopping ends the runs (a large batch takes more, cheaper, epochs)


def parse_points(text: str) -> list[tuple[int, float]]:
    """``128:3e-4,512:1e-3`` -> [(128, 3e-4), (512, 1e-3)]."""
    try:
        return [(int(b), float(lr)) for b, lr in (p.split(":") for p in text.split(",") if p)]
    except ValueError:
        raise SystemExit(f"--points {text!r}: want BATCH:LR pairs separated by commas, "
                         "e.g. 128:3e-4,512:1e-3") from None


def key(r: dict) -> tuple:
    return (r["dataset"], r["model"], r["batch"], r["lr"], r["way"], r.get("lam_units", "plain"))


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
    p.add_argument("--prepared", action="append", default=[], metavar="NAME=DIR",
                   help="a prepared directory for dataset NAME (skips the ETL; repeatable)")
    p.add_argument("--points", default=",".join(f"{b}:{lr:g}" for b, lr in POINTS),
                   help="BATCH:LR pairs")
    p.add_argument("--epochs", type=int, default=EPOCHS, help="most epochs a run")
    p.add_argument("--valid-sample", type=float, default=1.0,
                   help="the fraction of validation users scored (the trainer's flag)")
    p.add_argument("--check-dense", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "batch_defaults"))
    args = p.parse_args(argv)
    points = parse_points(args.points)
    given = dict(item.split("=", 1) for item in args.prepared)
    torch.set_num_threads(os.cpu_count() or 1)
    record = Path(args.out).with_suffix(".json")
    saved = json.loads(record.read_text()) if record.exists() else {}
    results = list(saved.get("results", []))
    commands = saved.get("commands", [saved["command"]] if saved else [])
    done = {key(r) for r in results}
    for name in args.datasets.split(","):
        if name in given:
            data = given[name]
        else:
            (ROOT / "var").mkdir(exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix="batch-defaults-", dir=ROOT / "var"))
            data = str(prepare(name, Path(args.shared), work))
        prep, rows, valid = load(data)
        for model in args.models.split(","):
            for batch, lr in points:
                # lambda: the model's default, in its default units (the module docstring)
                cfg = TrainConfig(data=data, model=model, batch_size=batch, lr=lr,
                                  epochs=args.epochs, valid_sample=args.valid_sample)
                hp = cfg.resolved()
                ways = ["default"] + (["dense"] if args.check_dense and (batch, lr) == points[-1]
                                      else [])
                for way in ways:
                    r = {"dataset": name, "model": model, "batch": batch, "lr": lr,
                         "lam": hp["lam"], "lam_units": hp["lam_units"], "way": way,
                         "users": rows.num_rows, "items": prep.n_items,
                         "valid_sample": args.valid_sample, "epochs_cap": args.epochs}
                    if key(r) in done:
                        continue
                    r.update(run(cfg, prep, rows, valid, True if way == "dense" else None))
                    results.append(r)
                    done.add(key(r))
                    print(f"{name} {model} batch {batch} lr {lr:g} ({way}): best NDCG "
                          f"{r['best_ndcg']:.4f} at epoch {r['best_epoch']}, "
                          f"{r['seconds_to_best']:.1f}s to it, {r['seconds']:.1f}s in all", flush=True)
                    write(results, commands, args)
    return 0


def write(results: list[dict], commands: list[str], args) -> None:
    stamp = {**report.stamp("batch_defaults.py"), "epochs_cap": EPOCHS,
             "reference": REFERENCE}
    commands = commands + [stamp["command"] + f" (commit {stamp['commit']}, {stamp['date']})"]
    lines = ["# Batch size and learning rate of the AutoRec family: quality against time\n",
             "Commands: " + "; ".join(f"`{c}`" for c in commands) + "  ",
             f"Machine: {stamp['machine']}.  ",
             "Width 200, joint mode, early stopping (patience 5, at most the cap of each "
             "command's --epochs), one process. Lambda: 'plain' rows took the value "
             "baselines.md chose in the units of their day (runs of 2026-11-24); 'overlap' rows "
             "each model's default (the module docstring). Fraction: best validation NDCG / the "
             "best of its (dataset, model, lambda units) group; speed-up: the reference's "
             f"(batch {REFERENCE[0]}, lr {REFERENCE[1]:g}) seconds to its best epoch / this "
             "one's, where the reference ran. 'dense': the same run through the dense scores.\n",
             "| dataset | model | lambda | batch | lr | way | best NDCG | fraction of best | "
             "best epoch | s to best | speed-up |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    group = lambda r: (r["dataset"], r["model"], r.get("lam_units", "plain"))  # noqa: E731
    ref = {group(r): r for r in results if (r["batch"], r["lr"]) == REFERENCE
           and r["way"] == "default"}
    best: dict[tuple, float] = {}
    for r in results:
        best[group(r)] = max(best.get(group(r), 0.0), r["best_ndcg"])
    for r in results:
        base = ref.get(group(r))
        speed = f"{base['seconds_to_best'] / max(r['seconds_to_best'], 1e-9):.1f}x" if base else "-"
        lines.append(f"| {r['dataset']} | {r['model']} | {r['lam']:g} "
                     f"({r.get('lam_units', 'plain')}) | {r['batch']} | {r['lr']:g} | {r['way']} | "
                     f"{r['best_ndcg']:.4f} | {r['best_ndcg'] / best[group(r)]:.3f} | "
                     f"{r['best_epoch']} | {r['seconds_to_best']:.1f} | {speed} |")
    report.publish(Path(args.out), {**stamp, "commands": commands, "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
