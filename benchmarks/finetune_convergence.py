"""Does fine-tune phase 2 converge? Its trained predict head against the exact optimum.

    .venv/bin/python benchmarks/finetune_convergence.py --data var/data/ml-100k var/data/ml-latest-small

Limited fine-tune's phase 2 trains the predict head alone on the frozen encoder: a ridge regression
per item, whose exact minimiser ``models.autorec.ridge.reference_head`` computes. Each run trains
NCE-AutoRec (and NS-AutoRec) in limited fine-tune mode with the project's own pieces in one
process (``benchmarks/tune_defaults.train_one``: the feed, the steps, the phases and early stopping
of ``training.loop``), for several phase-2 learning rates (``--finetune-lr``), then puts the ridge
head on the same frozen encoder and scores both on validation. A phase 2 that converges reaches
the ridge head's validation NDCG (early stopping may even pass it); one that stops at the epoch
cap short of it is undertrained. Results: ``benchmarks/results/finetune_convergence.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.report import publish, stamp  # noqa: E402
from benchmarks.tune_defaults import load, train_one  # noqa: E402
from models.autorec.ridge import reference_head as ridge_head  # noqa: E402
from training.closed_form import validate  # noqa: E402
from training.config import TrainConfig  # noqa: E402

LRS = [3e-4, 1e-3, 3e-3, 1e-2]


def measure(cfg: TrainConfig, prep, rows, valid) -> dict:
    """One limited fine-tune run, and the ridge head on its frozen encoder."""
    out = train_one(cfg, prep, rows, valid)
    net = out["net"]
    t0 = time.perf_counter()
    weight, bias = ridge_head(net, rows, prep.n_items, net.lam * net.lam_scale)
    ridge = copy.deepcopy(net)
    ridge.heads["predict"].weight.data.copy_(weight)
    ridge.heads["predict"].bias.data.copy_(bias)
    ridge_ndcg = validate(ridge.eval(), rows)[0]
    phase1, phase2 = out["phase_epochs"]
    return {"dataset": prep.dataset, "model": cfg.model, "lam": cfg.lam,
            "finetune_init": cfg.finetune_init, "finetune_lr": cfg.finetune_lr,
            "phase1_epochs": phase1, "phase2_epochs": phase2,
            "at_cap": phase2 >= cfg.epochs, "best_ndcg": out["best_ndcg"],
            "ridge_ndcg": ridge_ndcg, "fraction_of_ridge": out["best_ndcg"] / ridge_ndcg,
            "seconds": out["seconds"], "ridge_seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="prepared directories")
    p.add_argument("--models", nargs="+", default=["nce-autorec", "ns-autorec"])
    p.add_argument("--lams", type=float, nargs="+", default=[3.0, 30.0])
    p.add_argument("--lrs", type=float, nargs="+", default=LRS, help="phase-2 learning rates")
    p.add_argument("--epochs", type=int, default=200, help="phase 2's cap")
    p.add_argument("--inits", nargs="+", default=["as-is", "ridge"],
                   help="where phase 2's head starts (--finetune-init)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "finetune_convergence"))
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the committed .json without training")
    args = p.parse_args(argv)
    if args.report_only:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        results = saved.pop("results")
        write(Path(args.out), saved, results, saved.pop("epochs", args.epochs))
        return 0
    torch.set_num_threads(2)
    meta = stamp("finetune_convergence.py", argv)
    results = []
    for data in args.data:
        prep, rows, valid = load(data)
        for model in args.models:
            for lam, init, lr in itertools.product(args.lams, args.inits, args.lrs):
                cfg = TrainConfig(data=data, model=model, mode="limited-finetune", lam=lam,
                                  finetune_lr=lr, finetune_init=init, epochs=args.epochs)
                r = measure(cfg, prep, rows, valid)
                results.append(r)
                print(f"{r['dataset']} {model} lam {lam:g} {init} finetune-lr {lr:g}: "
                      f"phase 1 {r['phase1_epochs']} epochs, phase 2 {r['phase2_epochs']}"
                      f"{' (cap)' if r['at_cap'] else ''}; "
                      f"valid NDCG {r['best_ndcg']:.4f}, ridge head {r['ridge_ndcg']:.4f} "
                      f"({r['fraction_of_ridge']:.3f}); {r['seconds']:.0f}s", flush=True)
    write(Path(args.out), meta, results, args.epochs)
    return 0


def write(out: Path, meta: dict, results: list[dict], epochs: int) -> None:
    lines = ["# Fine-tune phase 2 against its exact optimum", "",
             f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}; {meta['date']}.", "",
             f"Limited fine-tune, phase 2 capped at {epochs} epochs, "
             "early stopping on validation NDCG (the model's patience). Ridge head: the exact "
             "minimiser of phase 2's loss on the same frozen encoder "
             "(`models.autorec.ridge.reference_head`), scored on the same validation users. Seconds: "
             "the run's wall time, phase 1 included, with other jobs sharing the cores: not a "
             "speed figure.", "",
             "| dataset | model | lambda | phase-2 start | phase-2 lr | phase 1 epochs | phase 2 epochs "
             "| valid NDCG "
             "| ridge head NDCG | fraction | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dataset']} | {r['model']} | {r['lam']:g} | {r['finetune_init']} | "
              f"{r['finetune_lr']:g} | {r['phase1_epochs']} | "
              f"{r['phase2_epochs']}{' (cap)' if r['at_cap'] else ''} | {r['best_ndcg']:.4f} | "
              f"{r['ridge_ndcg']:.4f} | {r['fraction_of_ridge']:.3f} | {r['seconds']:.0f} |"
              for r in results]
    publish(out, {**meta, "epochs": epochs, "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
