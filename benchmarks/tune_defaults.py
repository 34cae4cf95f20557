"""How training's default hyperparameters were chosen: a grid on real prepared datasets.

    .venv/bin/python benchmarks/tune_defaults.py --data var/data/ml-100k var/data/ml-latest-small

Each configuration trains with the project's own pieces (``training.feed``, ``training.step``,
``training.validate``, the early stopping of ``training.loop``) in one process, without Ray: a
grid of dozens of short runs would otherwise spend most of its time starting worker groups. The
maths is the same as a Ray run with one worker (tests check one and two workers agree); the chosen
defaults are then checked through the real Ray path by ``benchmarks/quality_ml100k.py``.

The score of a configuration is its best validation NDCG (protocol.md) with early stopping; a
configuration is good for the defaults when it is near the best on every dataset. Results go to
``benchmarks/results/tune_defaults.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from prepared import schema as S  # noqa: E402
from training import feed as F  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.loop import new_progress, next_state  # noqa: E402
from models.registry import MODELS  # noqa: E402
from prepared.reader import open_prepared  # noqa: E402
from training.step import make_optimizers, train_batch  # noqa: E402
from training.closed_form import validate  # noqa: E402

# lambda multiplies mean(W^2) (protocol.md), so useful values are large: 1e-4..1 changed nothing
# in a first pass on ml-100k (NDCG 0.239 +- 0.001), 10..100 did
GRID = {"width": [200, 500], "lr": [3e-4, 1e-3], "lam": [10.0, 30.0, 100.0]}
EPOCHS = 200  # a cap; early stopping (patience 5) ends every run of the grid before it


def train_one(cfg: TrainConfig, prep, rows: pa.Table, valid) -> dict:
    """One run in this process; returns the best validation NDCG, its epoch, the time and the
    model as it is at the end (``valid`` None: the final retraining, for ``cfg.epochs``)."""
    torch.manual_seed(cfg.seed)
    make = F.BatchMaker(F.plan(MODELS[cfg.model], prep, cfg))
    model = MODELS[cfg.model].from_config(prep.n_items, cfg.hyperparameters(), prep.n_users)
    all_phases = model.phases()
    opts = make_optimizers(model, all_phases[0], cfg.learning_rate)
    p = new_progress()
    rng = np.random.default_rng(cfg.seed)
    curve = []  # (seconds so far, validation NDCG) after each validated epoch
    t0 = time.perf_counter()
    while not p["done"]:
        phase = p["phase"]
        model.train()
        order = rng.permutation(rows.num_rows)
        sums: dict[str, float] = {}
        for lo in range(0, rows.num_rows, cfg.batch_size):
            batch = make(rows.take(order[lo:lo + cfg.batch_size]), p["epoch"])
            for h, v in train_batch(model, batch, all_phases[phase], opts).items():
                sums[h] = sums.get(h, 0.0) + float(v) * len(batch)
        ndcg = None
        if valid is not None and phase == len(all_phases) - 1:
            model.eval()  # in chunks of users: a fold-in over every user at once would not fit
            ndcg = validate(model, rows)[0]
            curve.append((time.perf_counter() - t0, ndcg))
        embed = (model.monitor(phase, {h: v / rows.num_rows for h, v in sums.items()})
                 if phase < len(all_phases) - 1 else None)
        _, switched = next_state(p, cfg, len(all_phases), embed, ndcg)
        if switched:
            if cfg.phase2_start == "ridge" and hasattr(model, "set_ridge_head"):
                ridge_start(model, rows, make, cfg.batch_size, p["epoch"])
            opts = make_optimizers(model, all_phases[p["phase"]], cfg.phase_lr(p["phase"]))
    return {"best_ndcg": p["best_ndcg"], "best_epoch": p["best_epoch"], "epochs": p["epoch"],
            "phase_epochs": p["phase_epochs"],
            "seconds": time.perf_counter() - t0, "curve": curve, "net": model.eval()}


def ridge_start(model, rows: pa.Table, make, batch_size: int, epoch: int) -> None:
    """``training.loop.ridge_start`` in one process: the sums over every row, then the solve."""
    gram = rtx = None
    for lo in range(0, rows.num_rows, batch_size):
        batch = make(rows.slice(lo, batch_size), epoch)
        g, r = model.ridge_statistics(batch.train_items, batch.train_offsets)
        gram, rtx = (g, r) if gram is None else (gram + g, rtx + r)
    model.set_ridge_head(gram, rtx, rows.num_rows)


def load(data: str):
    prep = open_prepared(data)
    rows = pq.read_table(prep.rows_uri)
    rows = rows.filter(pc.invert(rows.column(S.COLD)))
    return prep, rows, F.valid_batch(rows, 0, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="prepared directories")
    p.add_argument("--models", nargs="+", default=["autorec", "nce-autorec"])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tune_defaults"))
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the committed .json without training")
    args = p.parse_args(argv)
    if args.report_only:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        write(saved["results"], args, TrainConfig(data=""), saved)
        return 0
    torch.set_num_threads(2)
    base = TrainConfig(data="")
    results = []
    for data in args.data:
        prep, rows, valid = load(data)
        for model in args.models:
            for width, lr, lam in itertools.product(*GRID.values()):
                cfg = replace(base, data=data, model=model, width=width, lr=lr, lam=lam, epochs=EPOCHS)
                r = {"dataset": prep.dataset, "model": model, "width": width, "lr": lr, "lam": lam,
                     **{k: v for k, v in train_one(cfg, prep, rows, valid).items()
                        if k not in ("net", "curve", "phase_epochs")}}
                results.append(r)
                print(json.dumps(r), flush=True)
    write(results, args, base)
    return 0


def rank_configs(results: list[dict]) -> list[dict]:
    """Configurations by their worst NDCG relative to the best of each (dataset, model)."""
    best: dict[tuple, float] = {}
    for r in results:
        key = (r["dataset"], r["model"])
        best[key] = max(best.get(key, 0.0), r["best_ndcg"])
    by_cfg: dict[tuple, list[float]] = {}
    for r in results:
        by_cfg.setdefault((r["width"], r["lr"], r["lam"]), []).append(
            r["best_ndcg"] / best[(r["dataset"], r["model"])])
    rows = [{"width": w, "lr": lr, "lam": lam, "worst": min(v), "mean": sum(v) / len(v)}
            for (w, lr, lam), v in by_cfg.items()]
    return sorted(rows, key=lambda r: (-r["worst"], -r["mean"]))


def write(results: list[dict], args, base: TrainConfig, saved: dict | None = None) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fresh = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                       f"{torch.get_num_threads()} torch threads",
            "command": "python benchmarks/tune_defaults.py " + " ".join(sys.argv[1:]),
            "fixed": {"batch_size": base.batch_size, "epochs": EPOCHS,
                      "patience": base.stop_patience, "mode": "joint", "seed": base.seed},
            "date": time.strftime("%Y-%m-%d")}
    meta = {k: saved[k] for k in fresh} if saved else fresh
    out.with_suffix(".json").write_text(json.dumps({**meta, "results": results}, indent=2))
    lines = [f"# Default hyperparameters: grid on real data\n\nCommand: `{meta['command']}`  ",
             f"Machine: {meta['machine']}; {meta['date']}.  ",
             f"Fixed: {meta['fixed']}. Score: best validation NDCG with early stopping.\n"]
    lines += ["## Choice\n", "Each configuration's NDCG as a fraction of the best of its "
              "(dataset, model); the default is the configuration with the highest worst case "
              "over all four.\n",
              "| width | lr | lambda | worst fraction of best | mean fraction |", "|---|---|---|---|---|"]
    for r in rank_configs(results)[:5]:
        lines.append(f"| {r['width']} | {r['lr']:g} | {r['lam']:g} | {r['worst']:.3f} | {r['mean']:.3f} |")
    for (dataset, model), group in itertools.groupby(
            sorted(results, key=lambda r: (r["dataset"], r["model"], -r["best_ndcg"])),
            key=lambda r: (r["dataset"], r["model"])):
        group = list(group)
        lines += [f"\n## {dataset}, {model}\n", "| width | lr | lambda | best NDCG | epoch | s |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['width']} | {r['lr']:g} | {r['lam']:g} | {r['best_ndcg']:.4f} | "
                  f"{r['best_epoch']} | {r['seconds']:.0f} |" for r in group]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
