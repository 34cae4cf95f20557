"""The README's results table, printed from the committed report so that the README cannot drift
from it (``tests/benchmarks/test_readme.py`` checks the README holds exactly this output):

    python benchmarks/readme_table.py > /tmp/table.md   # then paste it over the README's table

The report is ``benchmarks/results/nce_report.json``, written by ``benchmarks/nce_report.py`` from
the experiments' committed results; this script only reformats it (test NDCG with 95% CIs, the
paired differences, the share of top-50 lists from the 10% most popular items), fewer columns
than ``nce_report.md`` so that it reads in a narrow README.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPORT = Path(__file__).resolve().parent / "results" / "nce_report.json"


def pm(value: list[float], signed: bool = False) -> str:
    """NDCG to 3 places; a paired difference (signed) to 4, as small as it often is."""
    mean, ci = value
    return f"{mean:+.4f} ± {ci:.4f}" if signed else f"{mean:.3f} ± {ci:.3f}"


def said(pair: dict | None) -> str:
    """A paired difference and its verdict (above, below, level, not significantly ...)."""
    return "–" if pair is None else f"{pm(pair['diff'], True)} {pair['verdict']}"


def table(report: dict) -> list[str]:
    """Issue 57's per-set rows where the report has them, else one row per experiment; markdown
    lines, no trailing newline."""
    if report.get("sets"):
        return sets_table(report["sets"])
    return experiments_table(report)


def sets_table(sets: list[dict]) -> list[str]:
    """Per set: the paper's NCE-AutoRec, the strongest family configuration (by validation), the
    best baseline, the difference with its verdict, the NCE head's increment with the same
    levers."""
    lines = ["| set | the paper's NCE-AutoRec | strongest family configuration | best baseline "
             "| strongest − best | NCE − AutoRec, same levers |", "|---|---|---|---|---|---|"]
    for r in sets:
        row = {x["model"]: x for x in r["rows"]}
        s, b = row[r["strongest"]], row[r["best_baseline"]]
        lines.append(
            f"| {r['dataset']} | {pm(r['paper_nce']) if r['paper_nce'] else '–'} "
            f"| {s['model']} {pm(s['ndcg'])} ({s['chosen']}) | {b['model']} {pm(b['ndcg'])} "
            f"| {said(r['strongest_minus_best'])} | {said(r['increment'])} |")
    return lines


def experiments_table(report: dict) -> list[str]:
    """One row per experiment (issue 15's reading)."""
    lines = ["| experiment | NCE-AutoRec | AutoRec | best baseline | NCE − AutoRec | NCE − best "
             "| top-10% share NCE / AutoRec / best |",
             "|---|---|---|---|---|---|---|"]
    for r in report["experiments"]:
        best, share = r["best_baseline"], r["top10_share"]
        lines.append(
            f"| {r['experiment']} | {pm(r['ndcg']['nce-autorec'])} | {pm(r['ndcg']['autorec'])} "
            f"| {best} {pm(r['ndcg'][best])} | {pm(r['nce_minus_autorec'], True)} "
            f"| {pm(r['nce_minus_best'], True)} "
            f"| {share['nce-autorec']:.3f} / {share['autorec']:.3f} / {share[best]:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, default=REPORT,
                   help="a report written by benchmarks/nce_report.py (its .json)")
    args = p.parse_args(argv)
    if not args.report.is_file():
        raise SystemExit(f"error: {args.report}: no such report; run benchmarks/nce_report.py "
                         "(see its docstring) or pass --report")
    print("\n".join(table(json.loads(args.report.read_text()))))


if __name__ == "__main__":
    main()
