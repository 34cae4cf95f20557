"""The AutoRec family's training step, exact fast losses against the dense scores, in one run.

    .venv/bin/python benchmarks/loss_speed.py [--shapes ml-20m,yahoo] [--batches 128,1024,4096]
                                              [--models autorec,nce-autorec,...] [--steps 4]
                                              [--widths 200,500,1000,2000]

A training step of the AutoRec family forms, through the dense reference, one (B, n_items) score
matrix per trained head and its gradient: O(B n d). The default since the fast losses
(models/autorec/losses.py) computes the same loss and gradients from the code and the head's parameters:
O(n d^2 + nnz d) for the MSE and NCE heads, O((nnz + negatives) d) for the NS head. This measures
the bare step (``training.step.train_batch``: forward, backward, Adam) both ways on batches held
in memory, so what it reports is the floor a training run can approach, without Ray Data or DDP
(``benchmarks/train_throughput.py`` measures those).

The batches have a real shape's catalogue and positives per user (``train_throughput.SHAPES``:
half of a user's positives are training items), items drawn from a power law as the synthetic
ETL does, R* values on the positives and N = 200 popularity-drawn negatives per user as (item,
count) pairs. Width 200. Each (shape, model, batch size, way): one warm-up step, then ``--steps``
steps, each on another batch. Reported: users per second, the ratio fast / dense, and which way
the model takes by default at that batch size (``AutoRec.dense_loss``).
Results: ``benchmarks/results/loss_speed.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.train_throughput import SHAPES as SCALE_SHAPES  # noqa: E402
from models.batch import Batch  # noqa: E402
from models.registry import MODELS  # noqa: E402
from training.step import make_optimizers, train_batch  # noqa: E402

WIDTH, NEGATIVES = 200, 200
# the throughput benchmark's shapes and Gowalla's (LightGCN's split, issue 57: 1,027,370 positives
# over train, valid and test): only with --shapes gowalla, so the default run is as before
SHAPES = {**SCALE_SHAPES, "gowalla": {"items": 40_981, "per_user": 34.4, "real_users": 29_858}}
ALL_MODELS = ("autorec", "ohns-autorec", "ns-autorec", "nce-autorec")


def make_batch(rng: np.random.Generator, n_items: int, per_user: float, b: int) -> Batch:
    """``b`` users' training rows (distinct items, power-law popularity), R*, negatives."""
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    pop /= pop.sum()
    sizes = np.maximum(1, rng.poisson(per_user / 2, b))
    rows = [np.unique(rng.choice(n_items, size=k, p=pop)) for k in sizes]
    negs = [np.unique(rng.choice(n_items, size=NEGATIVES, p=pop), return_counts=True)
            for _ in range(b)]
    off = lambda parts: torch.tensor(np.cumsum([0] + [len(p) for p in parts[:-1]]))
    items = torch.from_numpy(np.concatenate(rows)).long()
    return Batch(users=torch.arange(b), train_items=items, train_offsets=off(rows),
                 train_rstar=torch.rand(len(items)) * 5,
                 neg_items=torch.from_numpy(np.concatenate([n[0] for n in negs])).long(),
                 neg_counts=torch.from_numpy(np.concatenate([n[1] for n in negs])).long(),
                 neg_offsets=off([n[0] for n in negs]))


def users_per_second(model_name: str, n_items: int, batches: list[Batch], dense: bool,
                     width: int = WIDTH) -> float:
    torch.manual_seed(0)
    model = MODELS[model_name].from_config(n_items, {"width": width, "lam_units": "plain"})
    model.dense_loss = dense
    policy = model.trainer(model)
    steps = policy.phases()[0]  # the first phase (joint mode: both heads, the costliest)
    opts = make_optimizers(policy, steps, 1e-3)
    train_batch(model, batches[0], steps, opts)  # warm-up
    t0 = time.perf_counter()
    for batch in batches[1:]:
        train_batch(model, batch, steps, opts)
    return sum(len(b) for b in batches[1:]) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(SCALE_SHAPES))
    p.add_argument("--models", default=",".join(ALL_MODELS))
    p.add_argument("--batches", default="128,1024,4096")
    p.add_argument("--steps", type=int, default=4, help="timed steps per measurement")
    p.add_argument("--widths", default=str(WIDTH), help="code widths, comma-separated")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "loss_speed"))
    p.add_argument("--note", default="", help="a line on the conditions, kept with the results")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the .json (with --note, if given)")
    args = p.parse_args(argv)
    if args.report_only:
        saved = json.loads(Path(args.out).with_suffix(".json").read_text())
        write(saved["results"], args, saved)
        return 0
    torch.set_num_threads(os.cpu_count() or 1)
    results = []
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        for b in map(int, args.batches.split(",")):
            rng = np.random.default_rng(0)
            batches = [make_batch(rng, s["items"], s["per_user"], b) for _ in range(args.steps + 1)]
            for width, model in itertools.product(map(int, args.widths.split(",")),
                                                  args.models.split(",")):
                r = {"shape": shape, "items": s["items"], "model": model, "batch": b,
                     "width": width, "users": s["real_users"],
                     "dense": users_per_second(model, s["items"], batches, True, width),
                     "fast": users_per_second(model, s["items"], batches, False, width)}
                r["ratio"] = r["fast"] / r["dense"]
                results.append(r)
                print(f"{shape} width {width} {model} batch {b}: dense {r['dense']:,.0f} "
                      f"users/s, fast {r['fast']:,.0f} users/s ({r['ratio']:.1f}x)", flush=True)
    write(results, args)
    return 0


def default_way(model: str, batch: int, width: int = WIDTH) -> str:
    """What the model trains with by default at this batch size (``AutoRec.dense_for``)."""
    net = MODELS[model].from_config(1, {"width": width, "lam_units": "plain"})
    ways = {"dense" if net.dense_for(h, batch) else "fast" for h in net.heads_trained}
    return "/".join(sorted(ways)) if len(ways) > 1 else ways.pop()


def write(results: list[dict], args, saved: dict | None = None) -> None:
    stamp = {**report.stamp("loss_speed.py"), "negatives": NEGATIVES,
             "steps": args.steps, "note": args.note}
    if saved:  # --report-only: the measured run's stamp, the note as given now (or as saved)
        stamp = {**{k: saved.get(k, v) for k, v in stamp.items()}, "note": args.note or
                 saved.get("note", "")}
    lines = ["# The AutoRec family's training step: exact fast losses against dense scores\n",
             f"Command: `{stamp['command']}`  ", f"Machine: {stamp['machine']}; {stamp['date']}.  ",
             f"N = {NEGATIVES} negatives per user, joint mode (both heads); the "
             f"bare step (forward, backward, Adam) on in-memory batches, {stamp['steps']} timed "
             "steps after a warm-up. Users per second; ratio = fast / dense; default: the way "
             "the model takes at that batch size and width (the NS head always dense); epoch: "
             "the shape's real training users at the default way's rate (the best way's where "
             "they differ: no validation, feed or DDP).  ",
             f"{stamp['note']}\n",
             "| shape | width | model | batch | dense users/s | fast users/s | fast / dense | "
             "default | epoch s (default / best) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        width = r.get("width", WIDTH)  # runs before --widths measured width 200 only
        way = default_way(r["model"], r["batch"], width)
        rate = r["dense"] if way == "dense" else r["fast"] if way == "fast" else None
        users = SHAPES[r["shape"]]["real_users"] if r["shape"] in SHAPES else None
        epoch = "–" if not users else (
            f"{users / rate:,.0f} / {users / max(r['dense'], r['fast']):,.0f}" if rate else
            f"– / {users / max(r['dense'], r['fast']):,.0f}")
        lines.append(f"| {r['shape']} ({r['items']:,} items) | {width:,} | {r['model']} | "
                     f"{r['batch']:,} | {r['dense']:,.0f} | {r['fast']:,.0f} | "
                     f"{r['ratio']:.1f}x | {way} | {epoch} |")
    report.publish(Path(args.out), {**stamp, "results": results}, lines)


if __name__ == "__main__":
    sys.exit(main())
