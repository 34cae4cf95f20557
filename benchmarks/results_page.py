"""docs/results.md: every committed benchmark result's headline numbers on one generated page.

Each ``benchmarks/results/NAME.json`` gets a section: the title of its ``NAME.md``, the command,
commit, date, machine and CPU the JSON records, a link to the full ``NAME.md``, and a few tables of
the numbers the docs discuss, read from the JSON by ``HEADLINES[NAME]``. The experiments' folders
and the cluster run, which have no JSON, are listed with their recorded commit and a link. The
prose in README.md and docs/ links here for figures instead of copying them, so a rerun changes
one generated page, not sentences all over the docs.

    python benchmarks/results_page.py            # exit 1 when docs/results.md is not current
    python benchmarks/results_page.py --write    # rewrite docs/results.md from the results
    python benchmarks/results_page.py --print    # the page on stdout

``tests/benchmarks/test_results_page.py`` checks that docs/results.md is exactly what this script writes from
the committed results, so it cannot drift from them. A new result needs a ``HEADLINES`` entry (the
script names a result without one). Whether a result is older than the code it measures is
``benchmarks/staleness.py``'s question (it depends on later commits, not on the results).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLUSTER_RESULTS = ROOT / "infra" / "cluster" / "results"
PAGE = ROOT / "docs" / "results.md"
GIB = 2 ** 30


class PageError(Exception):
    """A result the page cannot show: no headline entry, or a row it names is missing."""


# -- formatting ------------------------------------------------------------------------------------

def num(x: float, decimals: int = 0) -> str:
    """``x`` to ``decimals`` places, thousands separated: 12,204,390; 0.1415."""
    return f"{x:,.{decimals}f}"


def pm(pair, decimals: int = 4, signed: bool = False) -> str:
    """A [mean, ci95] pair: ``0.2476 ± 0.0104`` (``+0.0040 ± 0.0028`` signed)."""
    mean, ci = pair
    return f"{mean:{'+' if signed else ''}.{decimals}f} ± {ci:.{decimals}f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows), ""]


def pick(rows: list[dict], **fields) -> dict:
    """The one row whose fields equal ``fields``; a PageError when not exactly one."""
    hits = [r for r in rows if all(r.get(k) == v for k, v in fields.items())]
    if len(hits) != 1:
        raise PageError(f"{len(hits)} rows have {fields}, not exactly one")
    return hits[0]


# -- headlines, one function per result: its JSON in, Markdown lines out -------------------------------

def batch_defaults(d: dict) -> list[str]:
    ref = tuple(d["reference"])
    rows, seen = [], []
    for r in d["results"]:
        if r["way"] != "default" or (r["dataset"], r["model"]) in seen:
            continue
        seen.append((r["dataset"], r["model"]))
        group = [g for g in d["results"] if (g["dataset"], g["model"]) == seen[-1]
                 and g["way"] == "default"]
        best = max(group, key=lambda g: g["best_ndcg"])
        shown = [g for g in group if (g["batch"], g["lr"]) in (ref, (512, 0.001))]
        for g in shown + ([best] if best not in shown else []):
            why = ("reference" if (g["batch"], g["lr"]) == ref else
                   "default" if (g["batch"], g["lr"]) == (512, 0.001) else "best")
            rows.append([g["dataset"], g["model"], why, g["batch"], g["lr"],
                         f"{g['lam']:g} ({g['lam_units']})", num(g["best_ndcg"], 4),
                         g["best_epoch"], num(g["seconds_to_best"], 1)])
    return table(["dataset", "model", "point", "batch", "lr", "λ (units)", "best valid NDCG",
                  "best epoch", "s to best"], rows)


def collapse(d: dict) -> list[str]:
    out = table(["dataset", "users", "items", "positives", "ω", "popularity NDCG"],
                [[k, num(v["users"]), num(v["items"]), num(v["positives"]), num(v["omega"], 3),
                  num(v["popularity_ndcg"], 4)] for k, v in d["datasets"].items()])
    return out + table(
        ["dataset", "run", "batch", "best valid NDCG", "/ popularity", "best epoch",
         "code rank at best", "health"],
        [[r["dataset"], f"`{r['run']}`", r["batch_size"], num(r["best_ndcg"], 4),
          num(r["vs_popularity"], 2), r["best_epoch"], num(r["code_rank_at_best"], 1),
          r["health"]] for r in d["results"]])


def demo(d: dict) -> list[str]:
    def test(label, group, metric="NDCG"):
        r = pick(d["test"], label=label, group=group, metric=metric)
        return pm((r["mean"], r["ci95"]), 4)

    models = list(d["training"])
    out = table(["stage", "seconds"], [[k, num(v, 1)] for k, v in d["seconds"].items()])
    return out + table(
        ["model", "best epoch", "valid NDCG", "test NDCG (warm)", "Recall@50 (warm)",
         "test NDCG (cold start)", "median popularity", "top-10% share", "coverage"],
        [[m, d["training"][m]["best_epoch"], num(d["training"][m]["best_valid_ndcg"], 4),
          test(m, "warm"), test(m, "warm", "Recall@50"), test(m, "cold"),
          num(d["popularity"][m]["median_popularity"], 0),
          num(d["popularity"][m]["share_top10pct"], 3), num(d["popularity"][m]["coverage"], 3)]
         for m in models])


def etl_scale(d: dict) -> list[str]:
    def step(r, name):
        return num(pick(r["steps"], step=name)["seconds"], 1)

    return table(["scale", "users", "positives", "ETL wall s", "floor wall s", "ETL / floor",
                  "ETL / roofline", "positives/s", "dedup s", "write s", "output GiB"],
                 [[r["scale"], num(r["users"]), num(r["positives"]), num(r["wall_s"], 1),
                   num(r["floor_wall_s"], 1), num(r["ratio_to_floor"], 2),
                   num(r["ratio_to_roofline"], 2), num(r["positives_per_s"]), step(r, "dedup"),
                   step(r, "write"), num(r["output_gib"], 2)] for r in d["runs"]])


def evaluate_speed(d: dict) -> list[str]:
    out = table(["input", "baseline wall s", "new wall s", "speed-up", "baseline evaluate s",
                 "new evaluate s", "max abs difference"],
                [[name, num(r["baseline"]["wall_s"], 1), num(r["new"]["wall_s"], 1),
                  f"{r['ratio']:.2f}x", num(r["baseline"]["evaluate_seconds"], 1),
                  num(r["new"]["evaluate_seconds"], 1),
                  f"{r['parity']['max_abs_difference']:.1e} over {r['parity']['numbers']}"]
                 for name, r in d["results"].items()])
    for r in d["results"].values():
        phases = sorted(set(r["baseline"]["phases_s"]) | set(r["new"]["phases_s"]),
                        key=list(r["new"]["phases_s"]).index)
        out += table(["phase (s)", "baseline", "new"],
                     [[p, num(r["baseline"]["phases_s"].get(p, 0), 2),
                       num(r["new"]["phases_s"].get(p, 0), 2)] for p in phases])
    return out


def finetune_convergence(d: dict) -> list[str]:
    return table(["dataset", "λ", "phase-2 start", "phase-2 lr", "phase 1 epochs",
                  "phase 2 epochs", "valid NDCG", "ridge head NDCG", "fraction of ridge"],
                 [[r["dataset"], f"{r['lam']:g}", r["finetune_init"], r["finetune_lr"],
                   r["phase1_epochs"], f"{r['phase2_epochs']}{' (cap)' if r['at_cap'] else ''}",
                   num(r["best_ndcg"], 4), num(r["ridge_ndcg"], 4),
                   num(r["fraction_of_ridge"], 3)] for r in d["results"]])


def floors(d: dict) -> list[str]:
    peak = (d.get("peak") or {}).get("fp32")

    def rate(name: str, v: float) -> str:
        if name.startswith(("matmul", "bf16", "peak")):
            return f"{v / 1e9:.1f} GFLOP/s" + (f" ({v / peak:.2f} of the peak)"
                                               if peak and not name.startswith("peak") else "")
        if name == "sort":
            return f"{v / 1e6:.1f} M keys/s"
        return f"{v / GIB:.2f} GiB/s"

    peaks = {f"peak {k}": v for k, v in (d.get("peak") or {}).items()
             if k in ("fp32", "bf16") and v}
    out = table(["rate", "measured"], [[k, rate(k, v)] for k, v in
                                       {**peaks, **d["measured"]}.items()])
    shapes = list(d["stages"])
    stages = list(d["stages"][shapes[0]])
    at_peak = lambda r: num(r["peak_floor_s"]["total"], 1) if r.get("peak_floor_s") else "–"
    return out + table(["stage floor (s): best exact kernel / products at the peak", *shapes],
                       [[s, *(f"{num(d['stages'][sh][s]['floor_s']['total'], 1)} / "
                              f"{at_peak(d['stages'][sh][s])}" for sh in shapes)]
                        for s in stages])


def fold_in(d: dict) -> list[str]:
    ks = [k for k in d["results"][0] if k.isdigit()]
    return table(["dataset", "model", "best epoch", "trained NDCG",
                  *(f"fold-in {k} NDCG" for k in ks), "fold-in 60 s / 1000 users"],
                 [[r["dataset"], r["model"], r["best_epoch"], num(r["trained"]["ndcg"], 4),
                   *(num(r[k]["ndcg"], 4) for k in ks), num(r["60"]["seconds_per_1000"], 2)]
                  for r in d["results"]])


def fold_in_speed(d: dict) -> list[str]:
    return table(["dataset", "model", "users x items", "dense s", "gathered s", "blocked s",
                  "default s", "dense / default"],
                 [[r["dataset"], r["model"], f"{num(r['users'])} x {num(r['items'])}",
                   *(num(r[w]["seconds"], 2) for w in ("dense", "gathered", "blocked", "default")),
                   f"{r['dense']['seconds'] / r['default']['seconds']:.1f}x"]
                  for r in d["results"]])


def verify_cost(d: dict) -> list[str]:
    data = d["data"]
    return table(["data", "open, checked", "open, 1 thread", "open, unchecked", "reading the rows",
                  "zlib.crc32 a core", "memory read a core"],
                 [[f"{data['shape']}: {data['files']} files, {data['bytes'] / 2**30:.2f} GiB",
                   f"{num(d['open_s'], 2)} s ({d['verify_threads']} threads)",
                   f"{num(d['open_1_thread_s'], 2)} s", f"{num(d['open_without_checksums_s'], 3)} s",
                   f"{num(d['read_rows_s'], 1)} s", f"{num(d['crc32_gbps'], 2)} GB/s",
                   f"{num(d['memory_read_gbps'], 1)} GB/s"]])


def fixed_costs(d: dict) -> list[str]:
    med = d["median_s"]
    return table(["what", "median s", "range s"],
                 [[k, num(med[k], 2), f"{num(min(v), 2)}–{num(max(v), 2)}"]
                  for k, v in d["seconds"].items()])


def fresh_clone(d: dict) -> list[str]:
    def last_line(s: dict) -> str:
        text = s.get("summary", "").strip("= ")
        return f"`{text}`" if s["command"] == "make test" and text else ""

    return table(["step", "command", "exit", "seconds", "minutes", "commit", "outcome"],
                 [[k, f"`{s['command']}`", s["exit"], num(s["seconds"]), num(s["seconds"] / 60, 1),
                   s.get("commit", ""), last_line(s)] for k, s in d["steps"].items()])


def loss_speed(d: dict) -> list[str]:
    big = max(r["batch"] for r in d["results"])
    return [f"At batch {num(big)} (every batch in the .md):", ""] + table(
        ["shape", "model", "dense users/s", "fast users/s", "fast / dense"],
        [[f"{r['shape']} ({num(r['items'])} items)", r["model"], num(r["dense"]),
          num(r["fast"]), f"{r['ratio']:.1f}x"] for r in d["results"] if r["batch"] == big])


def loss_speed_width(d: dict) -> list[str]:
    """Seconds an epoch of the shape's users costs against the code's width, at the faster way."""
    rows = sorted(d["results"], key=lambda r: (r["shape"], r["model"], r["width"], r["batch"]))
    return ["Seconds of bare steps an epoch of the shape's real users costs, at the faster of "
            "the two ways (every batch and both ways in the .md):", ""] + table(
        ["shape", "model", "width", "batch", "fast / dense", "epoch s (best way)"],
        [[r["shape"], r["model"], num(r["width"]), num(r["batch"]), f"{r['ratio']:.1f}x",
          num(r["users"] / max(r["dense"], r["fast"]))] for r in rows])


def train_step(d: dict) -> list[str]:
    """The step by kernel and threads, against torch's kernel and the physical peak."""
    return [f"{d['model']} at the {d['shape']} shape, batch {num(d['batch'])}, the fast loss "
            "(products: the loss's timed `models.product.mm` calls):", ""] + table(
        ["width", "pos_weight", "threads", "kernel", "ms/step", "vs torch", "products GFLOP/s",
         "of peak"],
        [[num(r["width"]), f"{r.get('pos_weight', 0):g}", str(r["threads"]), r["kernel"],
          f"{r['step_s'] * 1e3:.1f}",
          f"{r['vs_torch']:.2f}x", f"{r['product_gflops']:.1f}",
          f"{r['of_peak']:.2f}" if r["of_peak"] is not None else "–"] for r in d["rows"]])


def nce_report(d: dict) -> list[str]:
    return nce_sets(d.get("sets") or []) + nce_experiments(d)


def nce_sets(sets: list[dict]) -> list[str]:
    """Issue 57's per-set reading, where the report has it: the strongest family configuration
    (by validation) against the best baseline, each difference with its verdict."""
    if not sets:
        return []

    def said(x: dict | None) -> str:
        return "–" if x is None else f"{pm(x['diff'], signed=True)} {x['verdict']}"

    rows = []
    for r in sets:
        row = {x["model"]: x for x in r["rows"]}
        s, b = row[r["strongest"]], row[r["best_baseline"]]
        rows.append([f"[{r['dataset']}](../benchmarks/results/experiment-{r['experiment']}"
                     "/README.md)", pm(r["paper_nce"]) if r["paper_nce"] else "–",
                     f"{s['model']} {pm(s['ndcg'])} ({s['chosen']})",
                     f"{b['model']} {pm(b['ndcg'])}", said(r["strongest_minus_best"]),
                     said(r["increment"])])
    return ["Per set, the family at its strongest (chosen on validation; extensions beyond the "
            "paper) against the best tuned baseline; level only by the ±1% equivalence test:",
            ""] + table(["set", "the paper's NCE-AutoRec", "strongest family configuration",
                         "best baseline", "strongest − best", "NCE − AutoRec, same levers"],
                        rows) + ["Per experiment (issue 15's reading):", ""]


def nce_experiments(d: dict) -> list[str]:
    out = table(["experiment", "NCE-AutoRec", "AutoRec", "best baseline", "NCE − AutoRec",
                 "NCE − best"],
                [[f"[{r['experiment']}](../benchmarks/results/experiment-{r['experiment']}"
                  "/README.md)", pm(r["ndcg"]["nce-autorec"]), pm(r["ndcg"]["autorec"]),
                  f"{r['best_baseline']} {pm(r['ndcg'][r['best_baseline']])}",
                  pm(r["nce_minus_autorec"], signed=True), pm(r["nce_minus_best"], signed=True)]
                 for r in d["experiments"]])
    return out + ["With the levers (the strongest AutoRec-family row against the best baseline, "
                  "and the NCE head's increment over AutoRec searched the same way):", ""] + table(
        ["set", "the paper's NCE-AutoRec", "strongest family row", "best baseline",
         "strongest − best", "NCE-AutoRec (levers)", "AutoRec (levers)", "NCE head's increment"],
        [[r["dataset"], pm(r["paper_nce"]), f"{r['strongest']} {pm(r['strongest_ndcg'])}",
          f"{r['best_baseline']} {pm(r['best_baseline_ndcg'])}",
          pm(r["strongest_minus_best"], signed=True), pm(r["nce_ndcg"]), pm(r["autorec_ndcg"]),
          pm(r["increment"], signed=True)] for r in d["levers"]])


def negative_draws(d: dict) -> list[str]:
    rows = []
    for users in dict.fromkeys(r["users"] for r in d["results"]):
        whole = pick(d["results"], users=users, way="whole")
        block = pick(d["results"], users=users, block=d["default_block"])
        rows.append([num(users), num(whole["seconds"], 4), num(block["seconds"], 4),
                     f"{whole['seconds'] / block['seconds']:.2f}x",
                     "yes" if whole["same_draws"] and block["same_draws"] else "**no**"])
    return table(["users a call", "whole s", f"blocked ({num(d['default_block'])}) s",
                  "whole / blocked", "same draws"], rows)


def peruser_step_speed(d: dict) -> list[str]:
    return table(["dataset", "model (draws, width)", "dense ms", "gathered ms", "dense / gathered",
                  "picks"],
                 [[r["dataset"], f"{r['model']} ({r['draws']}, {r['width']})",
                   num(r["dense_ms"], 1), num(r["gathered_ms"], 1),
                   f"{r['dense_ms'] / r['gathered_ms']:.2f}x", r["picks"]] for r in d["rows"]])


def projection(d: dict) -> list[str]:
    p = d["projection"]
    stages = list(p["stages"])
    out = table(["scale", "users", "positives", *(f"{s} s" for s in stages)],
                [[f"{pt['fraction']:g}", num(pt["users"]), num(pt["positives"]),
                  *(num(pt["seconds"][s]) for s in stages)] for pt in d["points"]])
    out += table(["stage", "fixed s", "µs per positive", "largest residual", "full scale s",
                  f"{p['factor']:g}x on one machine, min", "nodes for the full scale's time"],
                 [[s, num(v["fixed"]), num(v["slope"] * 1e6, 2),
                   f"{v['max_rel_residual'] * 100:.1f}%", num(v["seconds_full"]),
                   num(v["seconds_projected"] / 60, 1), v["nodes_for_full_scale_time"]]
                  for s, v in p["stages"].items()])
    pipe, disk = p["pipeline"], p["disk"]
    return out + [
        f"Whole pipeline at {p['factor']:g}x ({num(p['users'])} users, {num(p['positives'])} "
        f"positives), {pipe['epochs']} epochs, one machine: {num(pipe['one_node_s'] / 60)} min; "
        f"15 min needs {pipe['nodes_for_15_min']} such nodes. Disk: rows "
        f"{disk['rows']['gib_projected']:.1f} GiB, recs {disk['recs']['gib_projected']:.1f} GiB.",
        ""]


def quality_ml100k(d: dict) -> list[str]:
    out = table(["model", "valid NDCG", "Recall@50", "best epoch", "median popularity",
                 "top-10% share", "coverage"],
                [[m, pm((r["best_valid_ndcg"], r["ndcg_ci95"])),
                  num(r["best_valid_recall_at_50"], 4), r["best_epoch"],
                  num(r["median_popularity"]), num(r["share_top10pct"], 3),
                  num(r["coverage"], 3)] for m, r in d["results"].items()])
    p = d["paired_ndcg_nce_minus_autorec"]
    return out + [f"Paired NCE-AutoRec − AutoRec ({num(p['users'])} users): "
                  f"{pm((p['mean'], p['ci95']), signed=True)} (t-test p {p['p_t']:.2f}): "
                  f"{p['verdict']}.", ""]


def score_throughput(d: dict) -> list[str]:
    return table(["shape", "items", "Spark users/s", "reference users/s", "kernel users/s",
                  "kernel product ratio", "Spark product ratio", "kernel of the fp32 peak",
                  "Spark of the fp32 peak", "floor users/s",
                  "ratio to floor", "Spark warm call s", "all real users, min"],
                 [[r["shape"], num(r["items"]), num(r["spark_users_per_second"]),
                   num(r["reference_users_per_second"]), num(r["kernel_users_per_second"]),
                   num(r["kernel_matmul_ratio"], 2), num(r["spark_matmul_ratio"], 2),
                   *(num(r[k], 2) if r.get(k) is not None else "n/a"
                     for k in ("kernel_peak_ratio", "spark_peak_ratio")),
                   num(r["floor_users_per_second"]), num(r["ratio_to_floor"], 2),
                   num(r["spark_runs"][-1]["seconds"], 2), num(r["real_users_minutes"], 1)]
                  for r in d["results"]])


def scoring_exact(d: dict) -> list[str]:
    return [f"Product kernel: {d.get('product_kernel', 'auto')}.", ""] + table(
        ["model", "items", "users", "kernels", "lists identical", "values identical",
         "ranked whole", "largest value difference", "unfused s", "fused s"],
                 [[r["describe"].split(" (")[0] + " " + r["describe"].split(" (")[1].split(",")[0],
                   num(r["n_items"]), num(r["users"]),
                   ", ".join(f"{k}: {v}" for k, v in r.get("product_kernels", {}).items())
                   or d.get("product_kernel", "–"),
                   num(r["lists_identical"]),
                   num(r["values_identical"]), num(r["ranked_whole"]),
                   f"{r['max_value_difference']:.1e}", num(r["unfused_seconds"], 1),
                   num(r["fused_seconds"], 1)] for r in d["results"]])


def alternatives(d: dict) -> list[str]:
    return table(["part", "shape", "width", "ours", "s", "alternative", "s", "their s / ours"],
                 [[r["part"], r["shape"], num(r["width"]), r["ours"], num(r["ours_seconds"], 1),
                   r["theirs"], num(r["theirs_seconds"], 1), num(r["ratio"], 2)]
                  for r in d["results"]])


def train_throughput(d: dict) -> list[str]:
    def vs_one(r):
        if r["workers"] == 1:
            return "–"
        one = pick(d["results"], shape=r["shape"], workers=1, batch=r["batch"],
                   loss_path=r["loss_path"])
        return f"{r['users_per_second'] / one['users_per_second']:.2f}"

    return table(["shape", "loss", "workers", "batch", "users/s", "reference users/s",
                  "ratio", "vs 1 worker", "all-reduce MiB/step", "epoch s (with validation)"],
                 [[r["shape"], r["loss_path"], r["workers"], num(r["batch"]),
                   num(r["users_per_second"]), num(r["reference_users_per_second"]),
                   num(r["ratio_to_reference"], 2), vs_one(r), num(r["allreduce_mib_per_step"]),
                   num(r["epoch_seconds_with_validation"], 1)] for r in d["results"]])


def tune_defaults(d: dict) -> list[str]:
    out = table(["dataset", "users", "items", "training positives", "ω"],
                [[k, num(v["users"]), num(v["items"]), num(v["positives"]), num(v["omega"], 4)]
                 for k, v in d["datasets"].items()])
    rows = []
    for ds in d["datasets"]:
        for model in dict.fromkeys(r["model"] for r in d["results"] if r["dataset"] == ds):
            best = max((r for r in d["results"] if (r["dataset"], r["model"]) == (ds, model)),
                       key=lambda r: r["best_ndcg"])
            rows.append([ds, model, num(best["best_ndcg"], 4),
                         f"{best['lam']:g} ({best.get('lam_units', 'overlap')})",
                         best["lr"], best.get("batch_size", d["fixed"]["batch_size"]),
                         best["best_epoch"]])
    return out + ["The best grid point per dataset and model (the defaults' own scores, and λ "
                  "in one unit, are in the .md):", ""] + table(
        ["dataset", "model", "best valid NDCG", "λ (units as run)", "lr", "batch",
         "best epoch"], rows)


def validation_speed(d: dict) -> list[str]:
    return table(["shape", "threads", "before users/s", "now users/s", "now / before",
                  "floor users/s", "now / floor", "real epoch before, min", "real epoch now, min"],
                 [[r["shape"], r["threads"], num(r["before"]), num(r["now"]),
                   f"{r['now'] / r['before']:.2f}x", num(r["floor"]),
                   num(r["now"] / r["floor"], 2), num(r["real_epoch_s_before"] / 60, 1),
                   num(r["real_epoch_s"] / 60, 1)] for r in d["rows"]])


def yahoo_scale(d: dict) -> list[str]:
    st = d["stages"]
    total = sum(s["wall_s"] for s in st.values())
    out = table(["stage", "wall, min", "floor s", "wall / floor", "peak used GiB", "run at"],
                [[k, num(s["wall_s"] / 60, 1), num(d["floors_s"][k]),
                  f"{s['wall_s'] / d['floors_s'][k]:.1f}x", num(s["peak_used_gib"], 2), s["date"]]
                 for k, s in st.items()] + [["**total**", f"**{num(total / 60, 1)}**", "", "",
                                             "", ""]])
    out += table(["epoch", "training pass s", "validation s (users)", "whole epoch s", "users/s",
                  "valid NDCG"],
                 [[e["epoch"], num(e["train_seconds"]),
                   f"{num(e['valid_seconds'])} ({num(e['valid_users'])})",
                   num(e["epoch_seconds"]), num(e["users_per_second"]), num(e["valid_ndcg"], 4)]
                  for e in st["train"]["epochs"]])
    return out + table(["group", "metric", "test mean ± 95% CI", "users"],
                       [[m["group"], m["metric"], pm((m["mean"], m["ci95"])), num(m["users"])]
                        for m in st["evaluate"]["metrics"]
                        if m["metric"] in ("NDCG", "Recall@50")])


def preset_check(d: dict) -> list[str]:
    rows = []
    for name, r in d["sets"].items():
        for label, run in r["runs"].items():
            vs = run.get("vs_paper", {}).get("ndcg")
            rows.append([f"{name} ({r['density']:.2%})", label,
                         pm((run["test"]["ndcg"]["mean"], run["test"]["ndcg"]["ci95"])),
                         num(run["test"]["recall_at_20"]["mean"], 4),
                         pm((vs["mean"], vs["ci95"]), signed=True) if vs else "–"])
    return table(["generated set (train density)", "model", "test NDCG", "Recall@20",
                  "vs the paper's NCE-AutoRec"], rows)


def ensemble_check(d: dict) -> list[str]:
    means = d["test_mean_recall20"]
    rows = [[r["members"], num(r["valid_recall20"], 4),
             num(means[r["members"]], 4) if r["members"] in means else "–"] for r in d["valid"]
            if r["members"] == d["chosen_on_valid"] or "+" not in r["members"]]
    return table(["members (the chosen ensemble and each member alone)", "valid Recall@20",
                  "test Recall@20 (mean over final seeds)"], rows)


def scale_out(d: dict) -> list[str]:
    c = d["measured"]
    gbps = min(r["gbps"] for r in d["rows"])
    rows = [[f"{r['factor']}x", r["design"], str(r["nodes"]), num(r["global_batch"]),
             num(r["epoch_s"] / 60, 1), f"{r['efficiency']:.0%}",
             num(r["floor_epoch_s"] / 60, 1) if r["floor_epoch_s"] else "–"]
            for r in d["rows"] if r["gbps"] == gbps and r["nodes"] in (1, 32)]
    return [f"Measured: F {c['fixed_s']:.3f} s a step, u {c['per_user_s'] * 1e6:.1f} µs a user, "
            f"S {c['allreduce_bytes'] / 2**20:.0f} MiB (gloo loopback "
            f"{c['loopback_allreduce_s']:.3f} s); modelled at {gbps:g} Gb/s:", ""] + table(
        ["users", "design", "nodes", "global batch", "epoch min", "efficiency",
         "limit min (N → ∞)"], rows)


HEADLINES: dict[str, Callable[[dict], list[str]]] = {
    "batch_defaults": batch_defaults, "collapse": collapse, "demo": demo,
    "etl_scale": etl_scale, "evaluate_speed": evaluate_speed, "fixed_costs": fixed_costs,
    "finetune_convergence": finetune_convergence, "floors": floors, "fold_in": fold_in,
    "fold_in_speed": fold_in_speed, "fresh_clone": fresh_clone, "fresh_clone_alone": fresh_clone,
    "loss_speed": loss_speed, "loss_speed_width": loss_speed_width, "nce_report": nce_report,
    "negative_draws": negative_draws,
    "peruser_step_speed": peruser_step_speed, "projection": projection,
    "quality_ml100k": quality_ml100k, "score_throughput": score_throughput,
    "score_throughput_unpinned": score_throughput,
    "train_throughput": train_throughput, "tune_defaults": tune_defaults,
    "validation_speed": validation_speed, "verify_cost": verify_cost, "yahoo_scale": yahoo_scale,
    "scoring_exact": scoring_exact, "alternatives": alternatives, "preset_check": preset_check,
    "scoring_exact_openblas": scoring_exact, "ensemble_check": ensemble_check,
    "scale_out": scale_out, "train_step": train_step, "train_step_unpinned": train_step,
}


# -- the page --------------------------------------------------------------------------------------

def stamp(d: dict) -> dict[str, str]:
    """What ran, where and on which code, as the JSON records it (top level or under ``run``)."""
    run = d.get("run") if isinstance(d.get("run"), dict) else {}

    def get(key):
        return d.get(key, run.get(key))

    machine = get("machine")
    if isinstance(machine, dict):
        machine = ", ".join(f"{k} {v}" for k, v in machine.items())
    commands = d.get("commands") or []
    command, commit = get("command"), get("commit")
    if commit and re.fullmatch(r"[0-9a-f]{40}", commit):
        commit = commit[:7]
    return {"command": f"`{command.strip()}`" + (f" (one of {len(commands)} commands: all in "
                                                 "the .md)" if len(commands) > 1 else "")
            if command else "not recorded",
            "commit": f"`{commit}`" if commit else "not recorded",
            "date": str(get("date") or "not recorded"),
            "machine": str(machine or "not recorded"), "cpu": str(get("cpu") or "")}


def title(md: Path) -> str:
    """The first ``# `` heading of a result's Markdown, '' when it has none."""
    if not md.is_file():
        return ""
    return next((line[2:].strip() for line in md.read_text().splitlines()
                 if line.startswith("# ")), "")


def recorded_commit_line(md: Path) -> str:
    """A Markdown result's ``Commit:`` line, its text after the colon; '' when it has none."""
    m = re.search(r"^Commit: *(.+?) *$", md.read_text(), re.M) if md.is_file() else None
    return m.group(1).strip() if m else ""


def section(name: str, data: dict, results: Path) -> list[str]:
    if name not in HEADLINES:
        raise PageError(f"benchmarks/results/{name}.json has no entry in benchmarks/"
                        f"results_page.py HEADLINES; fix: add a function that picks its headline "
                        f"numbers")
    s, md = stamp(data), results / f"{name}.md"
    link = (f"[{name}.md](../benchmarks/results/{name}.md)" if md.is_file()
            else "no .md")
    lines = [f"## {name}", ""]
    if title(md):
        lines += [title(md), ""]
    lines += [f"- Command: {s['command']}", f"- Commit: {s['commit']}; date: {s['date']}",
              f"- Machine: {s['machine']}" + (f"; CPU: {s['cpu']}" if s["cpu"] else ""),
              f"- Full result: {link} ([{name}.json](../benchmarks/results/{name}.json))", ""]
    try:
        return lines + HEADLINES[name](data)
    except (KeyError, IndexError, TypeError, PageError) as e:
        raise PageError(f"benchmarks/results/{name}.json: {HEADLINES[name].__name__} cannot read "
                        f"it ({type(e).__name__}: {e}); fix the function or the result") from e


def page(results: Path = RESULTS, cluster: Path = CLUSTER_RESULTS) -> str:
    """The whole of docs/results.md, from the result files alone (nothing else is read)."""
    files = sorted(results.glob("*.json"))
    datas = {f.stem: json.loads(f.read_text()) for f in files}
    out = ["# Benchmark results", "",
           "Generated by `python benchmarks/results_page.py --write` from "
           "`benchmarks/results/*.json`: do not edit by hand (`tests/benchmarks/test_results_page.py` checks "
           "that this page is what the script writes from the committed results). Each section "
           "gives a result's headline numbers with the command, commit, date and machine it "
           "records, and links to its full report. Which results are older than the code they "
           "measure: `python benchmarks/staleness.py` ([scaling.md](scaling.md#benchmarks)).", ""]
    out += table(["result", "what", "date", "commit"],
                 [[f"[{n}](#{n})", title(results / f"{n}.md") or "-", stamp(d)["date"],
                   stamp(d)["commit"]] for n, d in datas.items()])
    for name, data in datas.items():
        out += section(name, data, results)
    others = [(p.name, p / "README.md") for p in sorted(results.iterdir()) if p.is_dir()]
    others += [(p.stem, p) for p in sorted(cluster.glob("*.md"))] if cluster.is_dir() else []
    if others:
        out += ["## Results without a JSON", "",
                "The experiments (each folder's README says what ran and how; their headline "
                "numbers are [nce_report](#nce_report)'s) and the cluster run:", ""]
        out += table(["result", "what", "commit"],
                     [[f"[{n}]({Path('..', md.relative_to(results.parents[1])).as_posix()})",
                       title(md) or "-", recorded_commit_line(md) or "not recorded"]
                      for n, md in others])
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help=f"rewrite {PAGE.relative_to(ROOT)}")
    g.add_argument("--print", action="store_true", help="print the page instead")
    args = p.parse_args(argv)
    try:
        text = page()
    except PageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.write:
        if str(ROOT) not in sys.path:  # run as a script: the repository's packages
            sys.path.insert(0, str(ROOT))
        from runtime.atomic import write_text

        write_text(PAGE, text)
        print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
        return 0
    current = PAGE.read_text() if PAGE.is_file() else ""
    if current != text:
        print(f"{PAGE.relative_to(ROOT)} is not what the results say; fix: python "
              "benchmarks/results_page.py --write", file=sys.stderr)
        return 1
    print(f"{PAGE.relative_to(ROOT)} is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
