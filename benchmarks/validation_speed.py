"""Validation's per-batch cost at the paper's large shapes: the top-50 of every validation user
and their NDCG and Recall@50, as each training epoch computes them.

    .venv/bin/python benchmarks/validation_speed.py [--shapes ml-20m,yahoo] [--batch 4096]
                                                    [--threads 2,1] [--batches 3]

Three ways on the same batches of validation users (NCE-AutoRec, width 200, its recommending
head), each (shape, threads) in one process:

    before   what validation did until now: the (B, n_items) scores, a copy masked, top-k, and
             the hits through a dense (B, n_items) truth matrix (kept here as the reference)
    now      ``training.validate.model_metrics``: ``Recommender.recommend`` scores users in
             cache-sized blocks and takes each block's top-k while its scores are in cache; the
             hits by a sorted-key lookup of the (user, item) pairs
    floor    the product alone (encoder and the head's (B, d) x (d, n) matrix product): what
             any exact scoring of every item must pay

One warm-up batch, then ``--batches`` others. Reported: validation users per second, ``now``
against ``before`` and against the floor, and the seconds a real-size epoch's validation would
take on one process at that thread count (a quarter of the users' positives are validation
items; every user with one is validated). Results: ``benchmarks/results/validation_speed.*``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.train_throughput import SHAPES  # noqa: E402
from models.batch import row_ids, sparse_rows  # noqa: E402
from models.registry import build  # noqa: E402
from prepared.protocol import TOP_K  # noqa: E402
from training.feed import ValidBatch  # noqa: E402
from training.validate import model_metrics  # noqa: E402

WIDTH = 200


def valid_rows(rng: np.random.Generator, n_items: int, per_user: float, b: int) -> ValidBatch:
    """``b`` users: half their positives as training items, a quarter as validation items
    (power-law popularity, disjoint), every user with at least one of each."""
    pop = 1.0 / np.arange(1, n_items + 1) ** 0.8
    pop /= pop.sum()
    train, valid = [], []
    for k in np.maximum(2, rng.poisson(per_user * 0.75, b)):
        items = np.unique(rng.choice(n_items, size=k, p=pop))
        rng.shuffle(items)
        cut = max(1, min(len(items) - 1, round(len(items) * 2 / 3))) if len(items) > 1 else 1
        t, v = np.sort(items[:cut]), np.sort(items[cut:])
        if len(v) == 0:
            v = np.array([(int(t[-1]) + 1) % n_items])
        train.append(t)
        valid.append(v)
    return ValidBatch(*sparse_rows(train), *sparse_rows(valid))


def before(model, vb: ValidBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The previous implementation, kept as the reference (training/validate.py before)."""
    scores = model.score(vb.train_items, vb.train_offsets)
    b, n_items = scores.shape
    scores = scores.clone()
    scores[row_ids(vb.train_offsets, len(vb.train_items)), vb.train_items] = -torch.inf
    top = torch.topk(scores, min(TOP_K, n_items), dim=1).indices
    truth = torch.zeros(b, n_items, dtype=torch.bool)
    truth[row_ids(vb.valid_offsets, len(vb.valid_items)), vb.valid_items] = True
    hits = torch.gather(truth, 1, top).to(torch.float64)
    n_truth = truth.sum(dim=1).to(torch.float64)
    discount = 1.0 / torch.log2(torch.arange(2, top.shape[1] + 2, dtype=torch.float64))
    ideal_all = torch.cumsum(1.0 / torch.log2(torch.arange(
        2, int(n_truth.max()) + 2, dtype=torch.float64)), 0)
    return (hits * discount).sum(dim=1) / ideal_all[n_truth.long() - 1], hits.sum(dim=1) / n_truth


def floor(model, vb: ValidBatch):
    return model.score(vb.train_items, vb.train_offsets)


def measure(shape: str, threads: int, b: int, n_batches: int, seed: int = 0) -> dict:
    torch.set_num_threads(threads)
    s = SHAPES[shape]
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": s["items"], "width": WIDTH}).eval()
    batches = [valid_rows(rng, s["items"], s["per_user"], b) for _ in range(n_batches + 1)]
    # the two ways must agree before their speeds mean anything
    for got, want in zip(model_metrics(model, batches[0]), before(model, batches[0])):
        assert torch.allclose(got, want, atol=1e-6), "now and before disagree"
    out = {"shape": shape, "threads": threads, "batch": b}
    with torch.no_grad():
        for way, f in (("before", before), ("now", model_metrics), ("floor", floor)):
            f(model, batches[0])  # warm-up
            t0 = time.perf_counter()
            for vb in batches[1:]:
                f(model, vb)
            out[way] = n_batches * b / (time.perf_counter() - t0)
            print(f"  {shape} {threads} thread(s) {way}: {out[way]:,.0f} users/s", flush=True)
    out["real_epoch_s"] = s["real_users"] / out["now"]
    out["real_epoch_s_before"] = s["real_users"] / out["before"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="ml-20m,yahoo", help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--batch", type=int, default=4096, help="validation users per batch")
    p.add_argument("--threads", default="2,1", help="torch threads, comma-separated")
    p.add_argument("--batches", type=int, default=3, help="timed batches per way")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "validation_speed"))
    a = p.parse_args(argv)
    stamp = report.stamp("validation_speed.py", argv)
    rows = [measure(shape, int(t), a.batch, a.batches)
            for shape in a.shapes.split(",") for t in a.threads.split(",")]
    lines = ["# Validation at the paper's large shapes: top-50, NDCG and Recall@50 per user", "",
             f"Command: `{stamp['command']}`  ",
             f"Machine: {stamp['machine']}; {stamp['date']}.  ",
             f"NCE-AutoRec, width {WIDTH}, batches of {a.batch} validation users. 'before': "
             "(B, n) scores, a masked copy, top-k, a dense truth matrix; 'now': users in "
             "cache-sized blocks, top-k per block, hits by key lookup; 'floor': the scoring "
             "product alone. Real epoch: every real user validated by one process at that "
             "thread count (two workers of one thread each take half the users each).", "",
             "| shape | threads | before users/s | now users/s | now / before | floor users/s "
             "| now / floor | real epoch before | real epoch now |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['threads']} | {r['before']:,.0f} | {r['now']:,.0f} | "
                     f"{r['now'] / r['before']:.2f}x | {r['floor']:,.0f} | "
                     f"{r['now'] / r['floor']:.2f} | {r['real_epoch_s_before'] / 60:.1f} min | "
                     f"{r['real_epoch_s'] / 60:.1f} min |")
    report.publish(Path(a.out), {**stamp, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
