"""Does the AutoRec family collapse on a large, very sparse set (issue 32, D5)? Validation NDCG
per epoch, the effective rank of the encoder's code and the popularity baseline's NDCG on the
same validation users, for each configuration given.

    .venv/bin/python benchmarks/collapse.py --data var/data/syn30k \\
        --run autorec --run nce-autorec --run autorec:batch_size=512,lr=1e-3 [--epochs 12]

A run is ``model[:field=value,...]``, the fields TrainConfig's (lam, lr, batch_size, width, ...);
what is not given is the model's default. Each run trains in this process with the trainer's
steps and early stopping (``benchmarks/tune_defaults.train_one``), at most ``--epochs`` epochs;
validation scores ``--valid-sample`` of the users (a fixed subset, as the trainer's
``--valid-sample``). The code's effective rank (``training.loop.effective_rank``) is measured on
the first 1,024 validation users after each epoch, as the trainer measures it on a rank's first
batch; popularity's NDCG (``training.validate.popularity_metrics``) on the same users as the
model's. Verdict: ``training.validate.health`` at the best epoch.
Results: ``benchmarks/results/collapse.{json,md}``; runs already there (same dataset and run)
are kept and skipped, so the sets can be measured in separate commands.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.tune_defaults import load, train_one  # noqa: E402
from etl.config import ETLConfig  # noqa: E402
from prepared import schema as S  # noqa: E402
from training.closed_form import SCORE_USERS  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.feed import in_valid_sample, valid_batch  # noqa: E402
from training.loop import effective_rank  # noqa: E402
from training.validate import health, popularity_metrics, popularity_order  # noqa: E402

DEFAULT_SHAPE = {f.name: f.default for f in fields(ETLConfig) if f.name in ("topics", "affinity",
                                                                           "zipf")}
RANK_USERS = 1024  # users whose codes give the effective rank (the trainer: a rank's first batch)


def parse_run(spec: str) -> tuple[str, dict]:
    """``model[:field=value,...]`` -> (model, {field: value}) with TrainConfig's field types."""
    model, _, rest = spec.partition(":")
    types = {f.name: f.type for f in fields(TrainConfig)}
    out = {}
    for item in filter(None, rest.split(",")):
        name, _, value = item.partition("=")
        if name not in types:
            raise SystemExit(f"--run {spec!r}: {name!r} is no TrainConfig field; use one of "
                             + ", ".join(sorted(types)))
        kind = str(types[name])
        out[name] = (int(value) if kind.startswith("int") else
                     float(value) if kind.startswith("float") else value)
    return model, out


def dataset_label(prep) -> str:
    """The set's name in the results: the dataset's, and for synthetic data its shape where it is
    not the default's (``synthetic(topics=1000,affinity=0.7,zipf=0.6)``), so that an easy and a
    hard generated set are told apart."""
    if prep.dataset != "synthetic":
        return prep.dataset
    params = prep.manifest.get("parameters", {})
    shape = {k: params[k] for k, default in DEFAULT_SHAPE.items()
             if k in params and params[k] != default}
    return "synthetic" + (f"({','.join(f'{k}={v:g}' for k, v in shape.items())})" if shape else "")


def valid_rows(rows, fraction: float):
    """The users validation scores (``training.closed_form.validate``'s sample)."""
    if fraction >= 1:
        return rows
    return rows.filter(in_valid_sample(rows.column(S.USER_INDEX).to_numpy(), fraction))


def popularity_ndcg(prep, rows) -> float:
    """Popularity's mean validation NDCG over the users of ``rows`` with a validation item."""
    order = popularity_order(prep.pop_train)
    total = count = 0.0
    for lo in range(0, rows.num_rows, SCORE_USERS):
        vb = valid_batch(rows.slice(lo, SCORE_USERS), 0, 1)
        if vb is not None:
            total += float(popularity_metrics(order, vb)[0].sum())
            count += len(vb)
    return total / count


def code_rank(first):
    """``watch`` for train_one: the effective rank of the codes of ``first``'s users."""
    @torch.no_grad()
    def watch(model) -> float:
        return effective_rank(model.user_codes(first.train_items, first.train_offsets))
    return watch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", nargs="+", required=True, help="prepared directories")
    p.add_argument("--run", action="append", required=True, help="model[:field=value,...]")
    p.add_argument("--epochs", type=int, default=12, help="most epochs per run")
    p.add_argument("--valid-sample", type=float, default=0.2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "collapse"))
    args = p.parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    record = Path(args.out).with_suffix(".json")
    saved = json.loads(record.read_text()) if record.exists() else {}
    results, datasets = list(saved.get("results", [])), dict(saved.get("datasets", {}))
    commands = saved.get("commands", [])
    done = {(r["dataset"], r["run"]) for r in results}
    for data in args.data:
        prep, rows, valid = load(data)
        scored = valid_rows(rows, args.valid_sample)
        pop = popularity_ndcg(prep, scored)
        first = valid_batch(scored.slice(0, RANK_USERS), 0, 1)
        name = dataset_label(prep)
        datasets[name] = {"path": data, "users": rows.num_rows, "items": prep.n_items,
                                  "positives": int(prep.pop_train.sum()),
                                  "omega": prep.user_overlap(False), "popularity_ndcg": pop}
        print(f"{data}: {rows.num_rows:,} users, {prep.n_items:,} items, popularity NDCG "
              f"{pop:.4f}", flush=True)
        for spec in args.run:
            if (name, spec) in done:
                continue
            model, given = parse_run(spec)
            cfg = TrainConfig(data=data, model=model, epochs=args.epochs,
                              valid_sample=args.valid_sample, **given)
            r = train_one(cfg, prep, rows, valid, watch=code_rank(first))
            trace = [{"epoch": i + 1, "seconds": s, "ndcg": n, "code_rank": k}
                     for i, ((s, n), k) in enumerate(zip(r["curve"], r["trace"]))]
            best = trace[r["best_epoch"] - 1]
            out = {"dataset": name, "data": data, "run": spec, "model": model,
                   "epochs_cap": args.epochs, "valid_sample": args.valid_sample,
                   "given": given, "resolved": cfg.resolved(), "batch_size": cfg.batch_size,
                   "best_ndcg": r["best_ndcg"], "best_epoch": r["best_epoch"],
                   "seconds_to_best": best["seconds"], "popularity_ndcg": pop,
                   "vs_popularity": r["best_ndcg"] / pop, "code_rank_at_best": best["code_rank"],
                   "health": health(r["best_ndcg"], pop, best["code_rank"]), "trace": trace}
            results.append(out)
            print(f"  {spec}: best NDCG {out['best_ndcg']:.4f} ({out['vs_popularity']:.2f}x "
                  f"popularity) at epoch {out['best_epoch']}, code rank "
                  f"{out['code_rank_at_best']:.2f}: {out['health']}; per epoch " + " ".join(
                      f"{t['ndcg']:.4f}/{t['code_rank']:.1f}" for t in trace), flush=True)
            write(results, datasets, commands, args)
    return 0


def write(results: list[dict], datasets: dict, commands: list[str], args) -> None:
    stamp = report.stamp("collapse.py")
    commands = commands + [f"{stamp['command']} (commit {stamp['commit']}, {stamp['date']})"]
    lines = ["# The AutoRec family on a large, very sparse set: collapse or not\n",
             "Commands: " + "; ".join(f"`{c}`" for c in commands) + "  ",
             f"Machine: {stamp['machine']}.  ",
             "One process, the trainer's steps and early stopping, at most each command's "
             "--epochs; validation on a fixed --valid-sample of the users. Code rank: the "
             f"effective rank of the encoder's code on {RANK_USERS} validation users (collapsed "
             "below 2). Popularity: its NDCG on the same users.\n",
             "| dataset | users | items | positives | omega | popularity NDCG |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {d} | {v['users']:,} | {v['items']:,} | {v['positives']:,} | "
              f"{v['omega']:.3f} | {v['popularity_ndcg']:.4f} |" for d, v in datasets.items()]
    lines += ["", "| dataset | run | lr | batch | lambda | best NDCG | / popularity | best epoch "
              "| s to best | code rank at best | health | NDCG / code rank per epoch |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        hp = r["resolved"]
        per = " ".join(f"{t['ndcg']:.4f}/{t['code_rank']:.1f}" for t in r["trace"])
        lines.append(f"| {r['dataset']} | {r['run']} | {hp['lr']:g} | {r['batch_size']} | "
                     f"{hp['lam']:g} | {r['best_ndcg']:.4f} | {r['vs_popularity']:.2f} | "
                     f"{r['best_epoch']} | {r['seconds_to_best']:.0f} | "
                     f"{r['code_rank_at_best']:.2f} | {r['health']} | {per} |")
    report.publish(Path(args.out), {**stamp, "commands": commands, "datasets": datasets,
                                    "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
