"""Scoring's streamed product and top-k (``models.stream_topk``: the fused kernel or the BLAS
tiles) against the unfused path and against float64, on trained models: the top-50 list of every
user, compared item for item and value for value.

    .venv/bin/python benchmarks/scoring_exact.py --model RUN/model.pt --data PREPARED [...]

Each ``--model`` goes with the ``--data`` at the same position (the prepared directory it was
trained on). Every user of the data is scored from its train items with those left out, as
``evaluation/score.py`` does, once with ``NCE_SCORE_TOPK=torch`` (the product into a block, the
mask, ``models.topk.top_k``) and once streamed (``--path``). Reported per model: users, lists
identical (items and order), values identical (bit for bit), rows the streamed path ranked whole
(ties, short rows, NaN), the largest difference of a value, each path's lists against the top 50
of the same factors in float64 (identical, near-ties only, beyond rounding: the exactness claim
is that the last is 0 on both), and the seconds of each path (one thread). Results:
``benchmarks/results/scoring_exact.{json,md}``."""

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


def both_ways(model, items, offsets, path: str = "auto") -> dict:
    """Every user's top K unfused (``NCE_SCORE_TOPK=torch``) and streamed (``path``: auto, fused
    or tiles), compared with each other and each with float64's lists (``against_float64``)."""
    import torch

    from models import product, stream_topk

    recomputed = []
    real = stream_topk.rank_whole

    def counting(*args):
        recomputed.append(len(args[5]))
        return real(*args)

    out = {}
    for mode in ("torch", path):
        os.environ[stream_topk.ENV] = mode
        stream_topk.rank_whole = counting
        try:
            t0 = time.perf_counter()
            out[mode] = model.recommend(items, offsets, K)
            out[f"{mode}_seconds"] = time.perf_counter() - t0
        finally:
            stream_topk.rank_whole = real
            os.environ.pop(stream_topk.ENV, None)
    (v0, i0), (v1, i1) = out["torch"], out[path]
    finite = torch.isfinite(v0) & torch.isfinite(v1)
    # the product kernels used, by the product's (items, width): each path's own shape
    # (the unfused block's whole catalogue, the fused path's tiles) is timed and chosen apart;
    # main forgets the choices between models, as a new scoring process starts with none
    kernels = {f"{n} x {d}": k for (n, d, _), k in product.chosen().items()}
    streamed = ({f"{n} x {d}": k for (n, d, _), k in stream_topk.chosen_paths().items()}
                if path == "auto" else {"pinned": path})
    return {"product_kernels": kernels, "streamed_path": streamed,
            "lists_identical": int((i0 == i1).all(dim=1).sum()),
            "values_identical": int(((v0 == v1) | (v0.isneginf() & v1.isneginf())).all(dim=1).sum()),
            "ranked_whole": sum(recomputed),
            "max_value_difference": float((v0 - v1)[finite].abs().max()) if finite.any() else 0.0,
            "unfused_seconds": round(out["torch_seconds"], 2),
            "fused_seconds": round(out[f"{path}_seconds"], 2),
            "float64": against_float64(model, items, offsets, {"unfused": i0, "streamed": i1})}


def against_float64(model, items, offsets, lists: dict, block: int = 1024) -> dict:
    """Each named list of every user (``lists``: name -> (users, K) items) against the top K of
    the model's scores in float64 (the same factors, multiplied in float64 once for all the
    lists, the user's items left out): lists identical; lists that differ only where the float64
    scores of the items they swap are within float32's rounding of each other (a dot product of
    d terms: (d + 2) eps32 (max |a||b| + max |bias|), twice the textbook bound); and lists that
    differ beyond it, which an exact top K of correctly rounded float32 products cannot (0 is
    the claim). Returns name -> those three counts."""
    import torch

    from models.batch import row_ids, user_slice

    eps = torch.finfo(torch.float32).eps
    counts = {name: {"identical": 0, "near_ties_only": 0, "beyond_rounding": 0} for name in lists}
    with torch.no_grad():
        for lo in range(0, len(offsets), block):
            hi = min(lo + block, len(offsets))
            rows, offs = user_slice(items, offsets, lo, hi)
            a, b, bias = model.score_factors(rows, offs)
            a, b = a.double(), b.double()
            exact = a @ b + (0.0 if bias is None else bias.double())
            if len(rows):
                exact[row_ids(offs, len(rows)), rows.long()] = -torch.inf
            top_bias = 0.0 if bias is None else float(bias.abs().max())
            tol = (a.shape[1] + 2) * eps * ((a.abs() @ b.abs()).amax(dim=1) + top_bias)
            for name, got in lists.items():
                got = got[lo:hi]
                want = torch.topk(exact, got.shape[1], dim=1).indices
                s_got, s_want = exact.gather(1, got), exact.gather(1, want)
                both_out = s_got.isneginf() & s_want.isneginf()
                gap = torch.where(both_out, 0.0, (s_got - s_want).abs())
                differs = (got != want).any(dim=1)
                too_far = (gap > tol[:, None]).any(dim=1)
                c = counts[name]
                c["identical"] += int((~differs).sum())
                c["near_ties_only"] += int((differs & ~too_far).sum())
                c["beyond_rounding"] += int((differs & too_far).sum())
    return counts


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
    p.add_argument("--path", choices=("auto", "fused", "tiles"), default="auto",
                   help="the streamed path compared with the unfused one (NCE_SCORE_TOPK): auto "
                        "= timed per shape, as scoring runs; fused (AVX-512) or tiles pinned")
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
        stream_topk.forget_paths()
        (items, offsets), users = rows_of(data)
        r = {"model": model_file, "data": data, "describe": model.describe(),
             "n_items": model.n_items, "users": users,
             **both_ways(model, items, offsets, args.path)}
        rows.append(r)
        print(r, flush=True)
    lines = ["# The streamed scoring path against the unfused one and float64, on trained models",
             "",
             f"Command: `{st['command']}`  ", f"Machine: {st['machine']}; {st['date']}.  ",
             f"Top {K} of every user from the train items, those left out; one thread; fused "
             f"kernel built by `{how}`. 'ranked whole': rows the fused path scored again and "
             "ranked by torch.topk (a tie among the k + 1 best, fewer than k + 1 candidates, "
             "NaN).", "",
             f"Product kernel: {args.product_kernel} (`--product-kernel`; the kernels "
             "column: each product shape's, items x width). Streamed path: "
             f"{args.path} (`--path`; the path column: what ran per product shape). Against "
             "float64: each path's lists against the top K of the same factors multiplied in "
             "float64: identical / differing only where the swapped items' float64 scores are "
             "within float32's rounding ((d + 2) eps32 (max |a||b| + max |bias|)) / differing "
             "beyond it (an exact top K cannot: 0 is the claim).", "",
             "| model | items | users | kernels | path | lists identical | values identical | "
             "ranked whole | largest value difference | unfused vs float64 | "
             "streamed vs float64 | unfused s | streamed s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f64(x: dict) -> str:
        return f"{x['identical']:,} / {x['near_ties_only']:,} / {x['beyond_rounding']:,}"

    for r in rows:
        kernels = ", ".join(f"{k}: {v}" for k, v in r["product_kernels"].items()) or (
            args.product_kernel if args.product_kernel != "auto" else "torch (untimed: small)")
        path = ", ".join(f"{k}: {v}" for k, v in r["streamed_path"].items()) or "tiles"
        lines.append(f"| {r['describe']} | {r['n_items']:,} | {r['users']:,} | {kernels} | "
                     f"{path} | {r['lists_identical']:,} | {r['values_identical']:,} | "
                     f"{r['ranked_whole']:,} | {r['max_value_difference']:.1e} | "
                     f"{f64(r['float64']['unfused'])} | {f64(r['float64']['streamed'])} | "
                     f"{r['unfused_seconds']:.1f} | {r['fused_seconds']:.1f} |")
    report.publish(Path(args.out), {**st, "kernel": how, "product_kernel": args.product_kernel,
                                    "path": args.path,
                                    "k": K, "results": rows}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
