"""Scoring's fused product and top-k (``models.stream_topk``) against the unfused path on trained
models: the top-50 list of every user, both ways, compared item for item and value for value.

    .venv/bin/python benchmarks/scoring_exact.py --model RUN/model.pt --data PREPARED [...]

Each ``--model`` goes with the ``--data`` at the same position (the prepared directory it was
trained on). Every user of the data is scored from its train items with those left out, as
``evaluation/score.py`` does, once with ``NCE_SCORE_TOPK=torch`` (the product into a block, the
mask, ``models.topk.top_k``) and once fused. Reported per model: users, lists identical (items and
order), values identical (bit for bit), rows the fused path ranked whole (ties, short rows, NaN),
the largest difference of a value, and the seconds of each path (one thread). Results:
``benchmarks/results/scoring_exact.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402

K = 50


def rows_of(data: str) -> tuple:
    import pandas as pd

    from models.batch import sparse_rows
    rows = list(pd.read_parquet(Path(data) / "rows", columns=["train_items"])["train_items"])
    return sparse_rows(rows), len(rows)


def both_ways(model, items, offsets) -> dict:
    import torch

    from models import product, stream_topk

    recomputed = []
    real = stream_topk.rank_whole

    def counting(*args):
        recomputed.append(len(args[5]))
        return real(*args)

    out = {}
    for mode in ("torch", "auto"):
        os.environ[stream_topk.ENV] = mode
        stream_topk.rank_whole = counting
        try:
            t0 = time.perf_counter()
            out[mode] = model.recommend(items, offsets, K)
            out[f"{mode}_seconds"] = time.perf_counter() - t0
        finally:
            stream_topk.rank_whole = real
            os.environ.pop(stream_topk.ENV, None)
    (v0, i0), (v1, i1) = out["torch"], out["auto"]
    finite = torch.isfinite(v0) & torch.isfinite(v1)
    # the product kernels used, by the product's (items, width): each path's own shape
    # (the unfused block's whole catalogue, the fused path's tiles) is timed and chosen apart;
    # main forgets the choices between models, as a new scoring process starts with none
    kernels = {f"{n} x {d}": k for (n, d, _), k in product.chosen().items()}
    return {"product_kernels": kernels,
            "lists_identical": int((i0 == i1).all(dim=1).sum()),
            "values_identical": int(((v0 == v1) | (v0.isneginf() & v1.isneginf())).all(dim=1).sum()),
            "ranked_whole": sum(recomputed),
            "max_value_difference": float((v0 - v1)[finite].abs().max()) if finite.any() else 0.0,
            "unfused_seconds": round(out["torch_seconds"], 2),
            "fused_seconds": round(out["auto_seconds"], 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--model", action="append", required=True, help="a trained model.pt")
    p.add_argument("--data", action="append", required=True, help="its prepared directory")
    p.add_argument("--product-kernel", choices=("auto", "torch", "numpy"), default="auto",
                   help="the product's kernel on both paths (NCE_KERNEL): auto = timed "
                        "per product shape, as scoring runs; torch (MKL) or numpy (OpenBLAS) "
                        "pinned, which separates the fused top-k's own exactness from two "
                        "kernels' rounding")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scoring_exact"))
    args = p.parse_args(argv)
    if len(args.model) != len(args.data):
        p.error("give one --data per --model, in the same order")
    import torch

    from models import product, stream_topk
    from models.registry import load_model_file

    os.environ[product.KERNEL_ENV] = args.product_kernel

    torch.set_num_threads(1)
    ok, how = stream_topk.available()
    if not ok:
        p.error(f"the fused path is not available here: {how}")
    st = report.stamp("scoring_exact.py", argv)
    rows = []
    for model_file, data in zip(args.model, args.data):
        model = load_model_file(model_file).eval()
        product.forget_choices()
        (items, offsets), users = rows_of(data)
        r = {"model": model_file, "data": data, "describe": model.describe(),
             "n_items": model.n_items, "users": users, **both_ways(model, items, offsets)}
        rows.append(r)
        print(r, flush=True)
    lines = ["# The fused scoring path against the unfused one, on trained models", "",
             f"Command: `{st['command']}`  ", f"Machine: {st['machine']}; {st['date']}.  ",
             f"Top {K} of every user from the train items, those left out; one thread; fused "
             f"kernel built by `{how}`. 'ranked whole': rows the fused path scored again and "
             "ranked by torch.topk (a tie among the k + 1 best, fewer than k + 1 candidates, "
             "NaN).", "",
             f"Product kernel: {args.product_kernel} (`--product-kernel`; the kernels "
             "column: each product shape's, items x width).", "",
             "| model | items | users | kernels | lists identical | values identical | "
             "ranked whole | largest value difference | unfused s | fused s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kernels = ", ".join(f"{k}: {v}" for k, v in r["product_kernels"].items()) or (
            args.product_kernel if args.product_kernel != "auto" else "torch (untimed: small)")
        lines.append(f"| {r['describe']} | {r['n_items']:,} | {r['users']:,} | {kernels} | "
                     f"{r['lists_identical']:,} | {r['values_identical']:,} | {r['ranked_whole']:,} "
                     f"| {r['max_value_difference']:.1e} | {r['unfused_seconds']:.1f} | "
                     f"{r['fused_seconds']:.1f} |")
    report.publish(Path(args.out), {**st, "kernel": how, "product_kernel": args.product_kernel,
                                    "k": K, "results": rows}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
