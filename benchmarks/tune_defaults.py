"""How training's default hyperparameters were chosen: a grid on real prepared datasets.

    .venv/bin/python benchmarks/tune_defaults.py --data var/data/ml-100k var/data/ml-latest-small

Each configuration trains through the trainer's own epochs (``training.loop.epochs``: what every
Ray Train worker runs, with its feed, steps, phases, validation and early stopping) in one
process, without Ray: a grid of dozens of short runs would otherwise spend most of its time
starting worker groups. The
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

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from models.registry import MODELS  # noqa: E402
from prepared import schema as S  # noqa: E402
from prepared.protocol import head_items  # noqa: E402
from prepared.reader import open_prepared  # noqa: E402
from runtime.atomic import write_text  # noqa: E402
from training import feed as F  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.loop import (  # noqa: E402
    LoopState,
    WorkerPlan,
    build_model,
    epochs,
    new_progress,
    table_shards,
)
from training.step import phase_optimizers  # noqa: E402
from training.train import STATISTICS_SPLIT  # noqa: E402

# lambda in overlap units (models/autorec/): lambda * omega multiplies mean(W^2). The plain
# form's best values, 10-30 on ml-100k and ml-latest-small and about 0.3 on citeulike-a, are
# 3-10 and about 7 here. lr None: each model's own.
GRID = {"width": [200], "lr": [None], "lam": [1.0, 3.0, 10.0, 30.0]}
FAMILY = ("autorec", "ohns-autorec", "ns-autorec", "nce-autorec")
EPOCHS = 200  # a cap; early stopping (patience 5) ends every run of the grid before it


def train_one(cfg: TrainConfig, prep, rows: pa.Table, valid, watch=None) -> dict:
    """One run in this process, through the trainer's own epochs (``training.loop.epochs``: the
    feed, steps, phases, validation and early stopping a Ray worker runs); returns the best
    validation NDCG, its epoch, the time and the model as it is at the end (``valid`` None: the
    final retraining, for ``cfg.epochs``). Validation scores ``cfg.valid_sample`` of the users,
    as the trainer does. ``watch``: called with the model after each validation, its results
    returned in order as ``trace`` (outside the timed curve's seconds: what a benchmark measures
    beside NDCG, e.g. the code's rank)."""
    torch.manual_seed(cfg.seed)
    plan = WorkerPlan(cfg=cfg, feed=F.plan(MODELS[cfg.model], prep, cfg), n_items=prep.n_items,
                      n_users=prep.n_users,
                      data=MODELS[cfg.model].trainer.data_statistics(prep, STATISTICS_SPLIT, cfg),
                      head_items=head_items(prep.pop_train), popularity=prep.pop_train)
    model, policy = build_model(cfg, prep.n_items, prep.n_users, plan.data, plan.popularity)
    if MODELS[cfg.model].trainer.starts_from_data(cfg):  # e.g. --start-from svd, as train.py
        from training.closed_form import matrices

        policy.start(*matrices(prep, cfg, rows), cfg.seed)
        plan = replace(plan, start={k: v.clone() for k, v in model.state_dict().items()})
    state = LoopState(new_progress(),
                      phase_optimizers(policy, policy.phases(), 0, cfg.learning_rate))
    if valid is not None:
        valid = rows.filter(F.in_valid_sample(rows.column(S.USER_INDEX).to_numpy(),
                                              cfg.valid_sample))
    shards = table_shards(rows, cfg.batch_size, cfg.seed, valid)
    curve = []  # (seconds so far, validation NDCG) after each validated epoch
    trace = []
    seconds = 0.0  # the epochs' own: what ``watch`` takes is left out
    for record, _ in epochs(plan, model, policy, state, shards, torch.device("cpu"), quiet=True):
        seconds += record["epoch_seconds"]
        if "valid_ndcg" in record:
            curve.append((seconds, record["valid_ndcg"]))
            if watch is not None:
                trace.append(watch(model))
    p = state.progress
    return {"best_ndcg": p["best_ndcg"], "best_epoch": p["best_epoch"], "epochs": p["epoch"],
            "phase_epochs": p["phase_epochs"], "seconds": seconds, "curve": curve,
            "trace": trace, "net": model.eval(), "best": state.best}


def load(data: str):
    prep = open_prepared(data)
    rows = pq.read_table(prep.rows_uri)
    rows = rows.filter(pc.invert(rows.column(S.COLD)))
    return prep, rows, F.valid_batch(rows, 0, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="prepared directories")
    p.add_argument("--models", nargs="+", default=list(FAMILY))
    p.add_argument("--lam", nargs="+", type=float, default=GRID["lam"],
                   help="lambda values (in --lam-units)")
    p.add_argument("--width", nargs="+", type=int, default=GRID["width"])
    p.add_argument("--lr", nargs="+", type=float, default=GRID["lr"],
                   help="learning rates (default: each model's own)")
    p.add_argument("--batch-size", nargs="+", type=int, default=[None],
                   help="users per step (default: each model's own)")
    p.add_argument("--lam-units", default="overlap", choices=["overlap", "plain"])
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tune_defaults"))
    p.add_argument("--fresh", action="store_true",
                   help="start over; by default runs already in --out's .json are kept and skipped "
                        "(a grid of hours survives an interruption)")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the committed .json without training")
    args = p.parse_args(argv)
    out = Path(args.out)
    record = out.with_suffix(".json")
    saved = json.loads(record.read_text()) if record.exists() and not args.fresh else None
    if args.report_only:
        write(out, saved["results"], saved, saved.get("datasets", {}))
        return 0
    torch.set_num_threads(2)
    results = list(saved["results"]) if saved else []
    datasets = dict(saved.get("datasets", {})) if saved else {}
    meta = run_meta(saved)
    done = {key(r) for r in results}
    for data in args.data:
        prep, rows, valid = load(data)
        datasets[prep.dataset] = {"users": rows.num_rows, "items": prep.n_items,
                                  "positives": int(prep.pop_train.sum()),
                                  "omega": prep.user_overlap(False)}
        for model in args.models:
            for width, lr, lam, batch in itertools.product(args.width, args.lr, args.lam,
                                                           args.batch_size):
                cfg = replace(TrainConfig(data=data, model=model, batch_size=batch), width=width,
                              lr=lr, lam=lam, lam_units=args.lam_units, epochs=EPOCHS)
                r = {"dataset": prep.dataset, "model": model, "width": width,
                     "lr": cfg.learning_rate, "lam": lam, "lam_units": args.lam_units,
                     "batch_size": cfg.batch_size}
                if key(r) in done:
                    continue
                r.update({k: v for k, v in train_one(cfg, prep, rows, valid).items()
                          if k not in ("net", "curve", "phase_epochs", "trace")})
                results.append(r)
                done.add(key(r))
                print(json.dumps(r), flush=True)
                write(out, results, meta, datasets)  # after every run: nothing lost to a stop
    write(out, results, meta, datasets)
    return 0


def key(r: dict) -> tuple:
    return (r["dataset"], r["model"], r["width"], r["lr"], r["lam"], r.get("lam_units", "plain"),
            batch_of(r))


def batch_of(r: dict) -> int:
    """The record's batch size: runs before it was recorded (2026-11-27) used 128."""
    return r.get("batch_size", 128)


def run_meta(saved: dict | None) -> dict:
    fresh = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, "
                       f"{torch.get_num_threads()} torch threads",
             "command": "python benchmarks/tune_defaults.py " + " ".join(sys.argv[1:]),
             "fixed": {"batch_size": "each model's unless the record says", "epochs": EPOCHS,
                       "patience": "each model's", "mode": "each model's default (joint)",
                       "seed": TrainConfig(data="").seed},
             "date": time.strftime("%Y-%m-%d")}
    if saved:  # a resumed grid: keep the first command, add this one
        commands = saved.get("commands", [saved["command"]])
        fresh = {**{k: saved[k] for k in fresh}, "commands": commands + [fresh["command"]]}
    return fresh


def defaults(model: str) -> dict:
    """The model's defaults as the trainer resolves them: what a user gets without flags."""
    cfg = TrainConfig(data="", model=model)
    hp = MODELS[model].defaults()
    return {"width": hp["width"], "lr": cfg.learning_rate, "lam": hp["lam"],
            "lam_units": hp["lam_units"], "batch_size": cfg.batch_size}


def in_units(results: list[dict], datasets: dict) -> list[dict]:
    """Each record with ``lam_plain`` (what multiplied mean(W^2)) and ``lam_overlap`` (lambda in
    the default units). Records in "popularity" units (kappa = omega U / positives: a unit tried
    first, measured by this grid on 2026-11-25) convert exactly: the penalty is the same."""
    out = []
    for r in results:
        d = datasets[r["dataset"]]
        omega = d.get("omega") or d["kappa"] * d["positives"] / d["users"]
        kappa = omega * d["users"] / d["positives"]
        units = r.get("lam_units", "plain")
        plain = r["lam"] * {"plain": 1.0, "popularity": kappa, "overlap": omega}[units]
        out.append({**r, "lam_plain": plain, "lam_overlap": float(f"{plain / omega:.3g}")})
    return out


def goal_rows(results: list[dict]) -> list[dict]:
    """Per (dataset, model): the default configuration's NDCG against the best of the grid (its
    own tuned NDCG); the issue's goal is a fraction of at least 0.9 everywhere."""
    rows = []
    for (dataset, model), group in itertools.groupby(
            sorted(results, key=lambda r: (r["dataset"], r["model"])),
            key=lambda r: (r["dataset"], r["model"])):
        group = [r for r in group if r.get("lam_units", "plain") != "plain"]
        if not group:
            continue
        best = max(group, key=lambda r: r["best_ndcg"])
        want = defaults(model)
        at_default = [r for r in group if r["lam_units"] == want["lam_units"]
                      and all(r[k] == want[k] for k in ("width", "lr", "lam"))
                      and batch_of(r) == want["batch_size"]]
        rows.append({"dataset": dataset, "model": model, "best": best,
                     "default": at_default[0] if at_default else None})
    return rows


def rank_configs(results: list[dict]) -> list[dict]:
    """(width, lr, lambda) by their worst NDCG relative to the best of each (dataset, model)."""
    best: dict[tuple, float] = {}
    for r in results:
        k = (r["dataset"], r["model"])
        best[k] = max(best.get(k, 0.0), r["best_ndcg"])
    by_cfg: dict[tuple, list[float]] = {}
    for r in results:
        by_cfg.setdefault((r["width"], r["lr"], r["lam_overlap"], batch_of(r)), []).append(
            r["best_ndcg"] / best[(r["dataset"], r["model"])])
    rows = [{"width": w, "lr": lr, "lam": lam, "batch": b, "worst": min(v),
             "mean": sum(v) / len(v), "n": len(v)} for (w, lr, lam, b), v in by_cfg.items()]
    return sorted(rows, key=lambda r: (-r["n"], -r["worst"], -r["mean"]))


def write(out: Path, results: list[dict], meta: dict, datasets: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out.with_suffix(".json"), json.dumps(
        {**meta, "datasets": datasets, "results": results}, indent=2))
    results = in_units(results, datasets)
    lines = ["# Default hyperparameters: grid on real data\n",
             "Commands: " + "; ".join(f"`{c}`" for c in meta.get("commands", [meta["command"]])) + "  ",
             f"Machine: {meta['machine']}; {meta['date']}.  ",
             f"Fixed: {meta['fixed']}. Score: best validation NDCG with early stopping. "
             "lambda is given in overlap units (models/autorec/model.py, the default), whatever the "
             "units it ran in: lambda * omega multiplies mean(W^2). Runs in popularity units "
             "(lambda * kappa, kappa = sum c^2 / (U sum c): the first unit this grid tried) "
             "convert exactly.\n",
             "## Datasets\n", "omega = sum_i c_i^2 / U^2, the unit of lambda "
             "(prepared.protocol.user_overlap); the best plain lambda (on mean(W^2) alone) "
             "moves with it.\n",
             "| dataset | users | items | training positives | positives per user | omega |",
             "|---|---|---|---|---|---|"]
    for d, v in sorted(datasets.items()):
        omega = v.get("omega") or v["kappa"] * v["positives"] / v["users"]
        lines.append(f"| {d} | {v['users']:,} | {v['items']:,} | {v['positives']:,} | "
                     f"{v['positives'] / v['users']:.1f} | {omega:.4f} |")
    lines += ["\n## The goal: defaults within 90% of each model's own tuned NDCG\n",
              "Tuned: the best of the grid below for that dataset and model. Default: the "
              "configuration a run without flags gets (each model's class).\n",
              "| dataset | model | default NDCG | tuned NDCG (lambda) | default / tuned |",
              "|---|---|---|---|---|"]
    for g in goal_rows(results):
        b, d = g["best"], g["default"]
        at_default = f"{d['best_ndcg']:.4f}" if d else "not run"
        frac = f"{d['best_ndcg'] / b['best_ndcg']:.3f}" if d else "-"
        lines.append(f"| {g['dataset']} | {g['model']} | {at_default} | "
                     f"{b['best_ndcg']:.4f} ({b['lam_overlap']:g}) | {frac} |")
    lines += ["\n## Configurations by their worst case\n",
              "Each configuration's NDCG as a fraction of the best of its (dataset, model); "
              "configurations run on the most (dataset, model) pairs first.\n",
              "| width | lr | batch | lambda | pairs | worst fraction of best | mean fraction |",
              "|---|---|---|---|---|---|---|"]
    for r in rank_configs(results)[:8]:
        lines.append(f"| {r['width']} | {r['lr']:g} | {r['batch']} | {r['lam']:g} | {r['n']} | "
                     f"{r['worst']:.3f} | {r['mean']:.3f} |")
    for (dataset, model), group in itertools.groupby(
            sorted(results, key=lambda r: (r["dataset"], r["model"], -r["best_ndcg"])),
            key=lambda r: (r["dataset"], r["model"])):
        lines += [f"\n## {dataset}, {model}\n",
                  "| width | lr | batch | lambda | as run (units) | plain lambda | best NDCG | epoch "
                  "| s |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['width']} | {r['lr']:g} | {batch_of(r)} | {r['lam_overlap']:g} | "
                  f"{r['lam']:g} ({r.get('lam_units', 'plain')}) | {r['lam_plain']:.3g} | "
                  f"{r['best_ndcg']:.4f} | {r['best_epoch']} | {r['seconds']:.0f} |" for r in group]
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
