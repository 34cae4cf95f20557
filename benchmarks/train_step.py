"""The AutoRec family's training step at a real shape, by product kernel and threads (issue 56,
item 3: the step's products against the machine's peak, and against torch's own kernel).

    .venv/bin/python benchmarks/train_step.py [--shape yahoo] [--batch 8192] [--widths 200]
                                              [--pos-weights 0,10] [--threads 1,2]
                                              [--steps 4] [--rounds 3]
                                              [--model nce-autorec]

The bare step (``training.step.train_batch``: forward, backward, fused Adam) through the fast
loss, joint mode (both heads), on in-memory batches of the shape's catalogue and positives per
user (``loss_speed.make_batch``). Each kernel ``models.product`` offers is run in turn in one
process, rounds interleaved so that a slow minute of the host hits each alike, the best round
kept: ``torch`` (MKL on x86: what a user's own torch code runs, the reference), ``numpy`` (its
OpenBLAS) and ``auto`` (what a run picks: ``models.product.mm``).

The fast loss's products (``mm``: the Gram W'W, h G, h'h, W (h'h)) are timed as they run. Their
FLOPs (2 m k n each; a Gram counted whole, although numpy's SYRK does half of it) over the
seconds spent in them is their rate, and that over the physical peak (``benchmarks/peak.py``'s
FMA loop on one core, times the threads) their share of it: issue 56's target is 0.6. The rest
of a step (the encoder's EmbeddingBag and its gradient, T'h, the element-wise passes, Adam) is
the ``rest`` column. Results: ``benchmarks/results/train_step.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.loss_speed import SHAPES, make_batch  # noqa: E402
from models import product  # noqa: E402
from models.autorec import losses  # noqa: E402
from models.registry import MODELS  # noqa: E402
from training.step import make_optimizers, train_batch  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "train_step"
KERNELS = ("torch", "numpy", "auto")


class TimedProducts:
    """``models.product.mm`` counting the FLOPs and seconds of every product it runs."""

    def __init__(self, mm):
        self.mm, self.flop, self.seconds = mm, 0.0, 0.0

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        out = self.mm(a, b)
        self.seconds += time.perf_counter() - t0
        self.flop += 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
        return out


def peak_per_core(seconds: float = 1.0) -> float | None:
    """The fp32 FMA loop's FLOP/s on this thread (None where no compiler built it)."""
    from benchmarks import peak
    lib, _ = peak.build()
    if not lib:
        return None
    run = peak.kernel(lib, "fp32")
    run()
    flop, t0 = 0.0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        flop += run()
    return flop / (time.perf_counter() - t0)


def measure(model_name: str, n_items: int, width: int, batches: list, threads: int,
            rounds: int, pos_weight: float = 0.0) -> dict[str, dict]:
    """Per kernel: the best round's seconds per step and its products' FLOPs and seconds."""
    torch.set_num_threads(threads)
    product.forget_choices()
    torch.manual_seed(0)
    model = MODELS[model_name].from_config(n_items, {"width": width, "lam_units": "plain",
                                                     "pos_weight": pos_weight})
    model.dense_loss = False
    policy = model.trainer(model)
    steps = policy.phases()[0]
    opts = make_optimizers(policy, steps, 1e-3)
    timed = TimedProducts(product.mm)
    losses.mm = timed
    best: dict[str, dict] = {}
    try:
        for kernel in KERNELS:  # warm-up: every kernel's first products (and auto's choices)
            os.environ[product.KERNEL_ENV] = kernel
            train_batch(model, batches[0], steps, opts)
        for _ in range(rounds):
            for kernel in KERNELS:
                os.environ[product.KERNEL_ENV] = kernel
                timed.flop = timed.seconds = 0.0
                t0 = time.perf_counter()
                for batch in batches[1:]:
                    train_batch(model, batch, steps, opts)
                step = (time.perf_counter() - t0) / len(batches[1:])
                if step < best.get(kernel, {}).get("step_s", float("inf")):
                    n = len(batches[1:])
                    best[kernel] = {"step_s": step, "product_gflop": timed.flop / n / 1e9,
                                    "product_s": timed.seconds / n}
    finally:
        losses.mm = product.mm
        os.environ.pop(product.KERNEL_ENV, None)
    best["auto"]["chosen"] = sorted({v for v in product.chosen().values()})
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="yahoo", choices=sorted(SHAPES))
    p.add_argument("--model", default="nce-autorec", choices=("autorec", "nce-autorec"),
                   help="a model whose heads all train through the fast MSE")
    p.add_argument("--batch", type=int, default=8192, help="users per step (default 8192)")
    p.add_argument("--widths", default="200", help="comma-separated widths (default 200)")
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--pos-weights", default="0,10",
                   help="comma-separated confidences on positives (the models' --pos-weight; 0 "
                        "is the paper's loss, 10 the recipe's on Gowalla; default 0,10)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per round (default 4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per kernel; the best is kept")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    stamp = report.stamp("train_step.py", argv)
    shape = SHAPES[a.shape]
    rng = np.random.default_rng(0)
    batches = [make_batch(rng, shape["items"], shape["per_user"], a.batch)
               for _ in range(a.steps + 1)]
    torch.set_num_threads(1)
    core_peak = peak_per_core()
    rows = []
    for width, alpha, threads in itertools.product(
            [int(w) for w in a.widths.split(",")], [float(x) for x in a.pos_weights.split(",")],
            [int(t) for t in a.threads.split(",")]):
        got = measure(a.model, shape["items"], width, batches, threads, a.rounds, alpha)
        for kernel in KERNELS:
            r = got[kernel]
            rate = r["product_gflop"] / r["product_s"]
            rows.append({"width": width, "pos_weight": alpha, "threads": threads,
                         "kernel": kernel, **r,
                         "users_per_s": a.batch / r["step_s"], "product_gflops": rate,
                         "of_peak": (rate * 1e9 / (core_peak * threads) if core_peak
                                     else None),
                         "vs_torch": got["torch"]["step_s"] / r["step_s"]})
            print(f"width {width} alpha {alpha:g} threads {threads} {kernel:5s} "
                  f"{r['step_s'] * 1e3:7.1f} ms/step"
                  f"  products {rate:6.1f} GFLOP/s", flush=True)
    payload = {**stamp, "shape": a.shape, "items": shape["items"], "model": a.model,
               "batch": a.batch, "peak_per_core_gflops": core_peak and core_peak / 1e9,
               "rows": rows}
    report.publish(Path(a.out), payload, markdown(payload))
    return 0


def markdown(p: dict) -> list[str]:
    peak = p["peak_per_core_gflops"]
    lines = [f"# {p['model']}'s training step at the {p['shape']} shape, by product kernel",
             "", f"Command: `{p['command']}`  ", f"Machine: {p['machine']}; {p['date']}.  ",
             f"{p['items']:,} items, batch {p['batch']:,}, joint mode, the fast loss (pos_weight: "
             "the confidence on positives, 0 the paper's loss); the bare step "
             "(forward, backward, fused Adam) on in-memory batches, kernels interleaved in one "
             "process, the best of the rounds. Reference: torch's kernel (`NCE_KERNEL=torch`, MKL "
             "on x86), what the same step in a user's own torch code runs. Products: the fast "
             "loss's `models.product.mm` calls timed as they run (a Gram counted whole: numpy's "
             "SYRK does half its FLOPs); of peak: their GFLOP/s over the physical fp32 peak "
             + (f"({peak:,.1f} GFLOP/s a core, benchmarks/peak.py's FMA loop, times the threads)."
                if peak else "(not measured: no C compiler)."), "",
             "| width | pos_weight | threads | kernel | ms/step | users/s | vs torch | products GFLOP/step "
             "| products ms/step | products GFLOP/s | of peak | rest ms/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
        kernel = r["kernel"] + (f" ({', '.join(r['chosen'])})" if r.get("chosen") else "")
        of_peak = f"{r['of_peak']:.2f}" if r["of_peak"] is not None else "–"
        lines.append(f"| {r['width']} | {r.get('pos_weight', 0):g} | {r['threads']} | {kernel} | "
                     f"{r['step_s'] * 1e3:.1f} | "
                     f"{r['users_per_s']:,.0f} | {r['vs_torch']:.2f}x | {r['product_gflop']:.1f} | "
                     f"{r['product_s'] * 1e3:.1f} | {r['product_gflops']:.1f} | {of_peak} | "
                     f"{(r['step_s'] - r['product_s']) * 1e3:.1f} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
