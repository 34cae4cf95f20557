"""Per-user models' training step: pair scores by one dense product against gathered item vectors.

    python benchmarks/peruser_step_speed.py

BPR, CML and CDAE score each positive and its sampled draws per step (``models.peruser.pair_dots``).
This times one forward and backward of those scores both ways, at each model's default draws and
width, on the shapes of ml-100k (1,447 items, about 30 positives a user) and citeulike-a (16,980
items, about 19), 128 users a batch, and says which way ``pair_dots`` picks.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from models import peruser  # noqa: E402
from models.registry import MODELS  # noqa: E402

SHAPES = {"ml-100k": (1_447, 30), "citeulike-a": (16_980, 19)}
BATCH, REPEATS = 128, 20


def step_seconds(way, n_items: int, per_user: int, draws: int, width: int) -> float:
    g = torch.Generator().manual_seed(0)
    items = torch.cat([torch.randperm(n_items, generator=g)[:per_user] for _ in range(BATCH)])
    rows = torch.repeat_interleave(torch.arange(BATCH), per_user)
    neg = torch.randint(n_items, (len(items), draws), generator=g)
    u = torch.randn(BATCH, width, requires_grad=True)
    v = torch.randn(n_items, width, requires_grad=True)
    times = []
    for _ in range(REPEATS + 2):
        t = time.perf_counter()
        pos, negs = way(v, rows, items, neg)(u)
        (pos.sum() + negs.sum()).backward()
        times.append(time.perf_counter() - t)
    return sorted(times[2:])[REPEATS // 2]  # the median, after two warm-up steps


def main() -> None:
    rows = []
    for dataset, (n_items, per_user) in SHAPES.items():
        for name in ("bpr", "cml", "cdae"):
            hp = MODELS[name].defaults()
            draws, width = hp["neg_ratio"], hp["width"]
            dense = step_seconds(peruser.dense_dots, n_items, per_user, draws, width)
            gathered = step_seconds(peruser.frozen_dots, n_items, per_user, draws, width)
            picks = ("gathered" if peruser.gathers(per_user * BATCH * (1 + draws), BATCH * n_items,
                                                   peruser.TRAIN_GATHER_COST) else "dense")
            rows.append({"dataset": dataset, "model": name, "draws": draws, "width": width,
                         "dense_ms": dense * 1e3, "gathered_ms": gathered * 1e3, "picks": picks})
            print(rows[-1], flush=True)
    run = report.stamp("peruser_step_speed.py")
    lines = ["# Per-user models' training step: dense product against gathered item vectors", "",
             f"Command: `{run['command']}`  ", f"Machine: {run['machine']}; {run['date']}.  ",
             f"One forward and backward of the pair scores of {BATCH} users (median of "
             f"{REPEATS}); ratio: dense / gathered, above 1 where gathering is faster. "
             "`pair_dots` picks the way by its rule (`models/peruser.py`).", "",
             "| shape | model (draws, width) | dense ms | gathered ms | dense / gathered | picks |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['model']} ({r['draws']}, {r['width']}) "
                     f"| {r['dense_ms']:.1f} | {r['gathered_ms']:.1f} "
                     f"| {r['dense_ms'] / r['gathered_ms']:.2f}x | {r['picks']} |")
    report.publish(Path(__file__).parent / "results" / "peruser_step_speed",
                   {"run": run, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
