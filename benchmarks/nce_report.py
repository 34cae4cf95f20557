"""Issue 15's question across experiments: does NCE-AutoRec beat AutoRec and the best baseline,
with less popular recommendations? One row per experiment, from its committed results folder
(``experiment/run.py``'s ``table.csv`` and ``paired.csv``), nothing re-run:

    python benchmarks/nce_report.py benchmarks/results/experiment-ml-100k \\
        benchmarks/results/experiment-ml-latest-small --out benchmarks/results/nce_report

The goal (issue 15), each part read from the paired per-user differences on test:
- at or above the best baseline: NCE-AutoRec minus it has a 95% CI reaching 0 or above (not
  significantly below). "Best baseline": the baseline with the highest test NDCG, each baseline
  having been chosen on validation; picking it by test only makes the bar higher for NCE-AutoRec;
- above AutoRec: NCE-AutoRec minus AutoRec has a CI wholly above 0;
- where paired.csv has them (evaluation/evaluate.py since issue 31), the Holm-corrected p-values of
  the paired t-test and the Wilcoxon signed-rank test are quoted beside each difference and verdict;
  the verdicts themselves stay the CIs' reading;
- less popular than AutoRec: both a smaller share of its top-50 lists from the 10% most popular
  items and a lower median training popularity of the items it recommends (either alone moves by
  noise when the two are close).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import publish, stamp  # noqa: E402

FAMILY = ("autorec", "ohns-autorec", "ns-autorec", "nce-autorec")  # the paper's models
FLOOR = "popularity"  # a reference, not a baseline anyone would ship


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: missing; pass a folder written by experiment/run.py "
                         "(with table.csv and paired.csv)")
    with path.open() as f:
        return list(csv.DictReader(f))


def summarise(folder: Path) -> dict:
    """The comparison of one experiment's NCE-AutoRec with AutoRec and the best baseline."""
    table = {r["model"]: r for r in read_csv(folder / "table.csv")}
    # with --seeds, paired.csv has each seed's rows beside the pooled one: the verdicts read
    # the pooled (an older paired.csv has no seed column: its rows are the only seed's)
    paired = {(r["label"], r["metric"]): r for r in read_csv(folder / "paired.csv")
              if r["reference"] == "nce-autorec" and r.get("seed", "pooled") == "pooled"}
    missing = [m for m in ("nce-autorec", "autorec") if m not in table]
    baselines = [m for m in table if m not in FAMILY and m != FLOOR]
    if missing or not baselines:
        raise SystemExit(f"{folder}: the experiment lacks {', '.join(missing) or 'a baseline'}; "
                         "the report compares NCE-AutoRec with AutoRec and at least one baseline")
    best = max(baselines, key=lambda m: float(table[m]["NDCG mean"]))

    def diff(label: str) -> tuple[float, float]:
        row = paired[(label, "NDCG")]
        return float(row["mean_difference"]), float(row["ci95"])

    def p_holm(label: str) -> tuple[float, float] | None:
        """(t, Wilcoxon) Holm-corrected p-values; None for a paired.csv written before them."""
        row = paired[(label, "NDCG")]
        return ((float(row["t_p_holm"]), float(row["wilcoxon_p_holm"]))
                if row.get("t_p_holm") else None)

    vs_autorec, vs_best = diff("autorec"), diff(best)
    share = {m: float(table[m]["share_top10pct"]) for m in ("nce-autorec", "autorec", best)}
    median = {m: float(table[m]["median_popularity"]) for m in ("nce-autorec", "autorec", best)}
    return {
        "experiment": folder.name.removeprefix("experiment-"),
        "ndcg": {m: (float(table[m]["NDCG mean"]), float(table[m]["NDCG ci95"]))
                 for m in ("nce-autorec", "autorec", best)},
        "chosen": {m: table[m]["chosen"] for m in ("nce-autorec", "autorec", best)},
        "best_baseline": best,
        "nce_minus_autorec": vs_autorec,
        "nce_minus_best": vs_best,
        "p_holm": {"nce_minus_autorec": p_holm("autorec"), "nce_minus_best": p_holm(best)},
        "top10_share": share,
        "median_popularity": median,
        "goal": {
            "at_or_above_best_baseline": vs_best[0] + vs_best[1] >= 0,
            "above_autorec": vs_autorec[0] - vs_autorec[1] > 0,
            "less_popular_than_autorec": (share["nce-autorec"] < share["autorec"]
                                          and median["nce-autorec"] < median["autorec"]),
        },
    }


def render(rows: list[dict]) -> list[str]:
    def pm(x: tuple[float, float], signed: bool = False) -> str:
        return f"{x[0]:+.4f} ± {x[1]:.4f}" if signed else f"{x[0]:.4f} ± {x[1]:.4f}"

    def yes(flag: bool) -> str:
        return "yes" if flag else "**no**"

    def p(x: tuple[float, float] | None) -> str:
        return f" (p {x[0]:.2g} t, {x[1]:.2g} Wilcoxon, Holm)" if x else ""

    lines = ["| experiment | NCE-AutoRec (chosen) | AutoRec (chosen) | best baseline (chosen) "
             "| NCE − AutoRec | NCE − best baseline "
             "| top-10% share (median popularity) NCE / AutoRec / best |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["best_baseline"]
        share, med = r["top10_share"], r["median_popularity"]
        lines.append(
            f"| {r['experiment']} | {pm(r['ndcg']['nce-autorec'])} ({r['chosen']['nce-autorec']}) "
            f"| {pm(r['ndcg']['autorec'])} ({r['chosen']['autorec']}) "
            f"| {b} {pm(r['ndcg'][b])} ({r['chosen'][b]}) "
            f"| {pm(r['nce_minus_autorec'], True)}{p(r['p_holm']['nce_minus_autorec'])} "
            f"| {pm(r['nce_minus_best'], True)}{p(r['p_holm']['nce_minus_best'])} "
            f"| " + " / ".join(f"{share[m]:.3f} ({med[m]:g})" for m in ("nce-autorec", "autorec", b))
            + " |")
    lines += ["", "Goal (issue 15), per experiment:", "",
              "| experiment | at or above the best baseline | above AutoRec (CI > 0) "
              "| less popular than AutoRec |", "|---|---|---|---|"]
    for r in rows:
        g = r["goal"]
        lines.append(f"| {r['experiment']} | {yes(g['at_or_above_best_baseline'])}"
                     f"{p(r['p_holm']['nce_minus_best'])} "
                     f"| {yes(g['above_autorec'])}{p(r['p_holm']['nce_minus_autorec'])} "
                     f"| {yes(g['less_popular_than_autorec'])} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path,
                    help="experiment results folders (table.csv, paired.csv)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/nce_report"),
                    help="writes OUT.md and OUT.json (default: %(default)s)")
    args = ap.parse_args(argv)
    rows = [summarise(f) for f in args.folders]
    run = stamp("nce_report.py", argv)
    lines = ["# NCE-AutoRec against AutoRec and the best baseline, per experiment", "",
             f"Command: `{run['command']}`  ", f"Date: {run['date']}.  ",
             "Test NDCG with 95% CIs; differences are paired per user (NCE-AutoRec minus the "
             "other, 95% CI; where given, p-values of the paired t-test and the Wilcoxon "
             "signed-rank test over users, Holm-corrected over the experiment's NDCG comparisons); "
             "every model chosen on validation (`experiment/run.py`). "
             "The goal's reading is in `benchmarks/nce_report.py`.", ""] + render(rows)
    publish(args.out, {"run": run, "experiments": rows}, lines)
    print("\n".join(render(rows)))


if __name__ == "__main__":
    main()
