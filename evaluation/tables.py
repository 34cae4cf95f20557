"""The experiment's tables as text: the cells of table.md (a row's mean ± CI, the paired
p-values, the seed spread), its second table of the common conventions, table.csv, and
paired.csv pooled over seeds.

Pure rendering of rows already computed: a row is one model's (``experiment.report.table_rows``
builds them from the evaluation's metrics and the experiment's choices); nothing here reads a file
or knows how the rows were chosen.
"""

from __future__ import annotations

import csv
import io
import math

from prepared.protocol import STANDARD, TABLE


def fmt_point(p: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(p.items())) or "defaults"


def best_of(rows: list[dict]) -> str | None:
    """The model the "best" comparisons are against (the best after the first by test NDCG)."""
    return next((r["best"]["reference"] for r in rows if r.get("best")), None)


def p_pair(p: tuple[float, float] | None) -> str:
    """``0.0031 / 0.0042``: the t-test's and the Wilcoxon test's p-values; "–" where undefined."""
    return " / ".join("–" if math.isnan(x) else f"{x:.2g}" for x in p) if p else "–"


def verdict(diff: tuple[float, float] | None, tost_p: float | None) -> str:
    """A paired difference (mean, 95% CI half-width) in words: above / below where the CI excludes
    0; level where the equivalence test's ``tost_p`` is below 0.05 (its margin in the caption);
    else not significantly above / below; "–" where there is no difference."""
    if not diff:
        return "–"
    d, ci = diff
    if d - ci > 0:
        return "above"
    if d + ci < 0:
        return "below"
    if tost_p is not None and tost_p < 0.05:
        return "level"
    return "not significantly " + ("below" if d < 0 else "above")


def standard_md(rows: list[dict], seeds: int) -> list[str]:
    """The second table: the common conventions (``STANDARD``) of the same lists and users,
    that a number may be set beside a published table using them. Not the paper's definitions,
    so never in its columns."""
    if not any(m in r for r in rows for m in STANDARD):
        return []
    lines = ["", "## The common conventions (an extension beside the paper's metrics)", "",
             "The same lists and users, mean ± 95% CI" + (" (pooled over the seeds as above)"
                                                         if seeds > 1 else "")
             + ": NDCG@K (truncated) with its ideal over min(|T|, K) test items, where the "
             "paper's NDCG ranks the whole top-50 against an untruncated ideal; Recall@K over "
             "|T| as the paper's; HR@K, 1 where any test item is in the top K; MRR@K, 1 / the rank "
             "of the first test item in the top K (0 where none is).", "",
             "| model | " + " | ".join(STANDARD) + " |", "|" + "---|" * (len(STANDARD) + 1)]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(ci_cell(r, m) for m in STANDARD) + " |")
    return lines


def ci_cell(r: dict, metric: str) -> str:
    """``0.2454 ± 0.0102``: a row's mean and 95% CI of ``metric``; "–" where it has none."""
    return f"{r[metric][0]:.4f} ± {r[metric][1]:.4f}" if metric in r else "–"


def spread(x: tuple[float, float, float] | None) -> str:
    """``0.0021 (0.2401–0.2442)``: sd over seeds (min–max); "–" with one seed."""
    if not x or math.isnan(x[0]):
        return "–"
    return f"{x[0]:.4f} ({x[1]:.4f}–{x[2]:.4f})"


def table_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", *[f"{m} {x}" for m in TABLE for x in ("mean", "ci95")],
                "paired_ndcg_minus_first", "paired_ci95", "paired_t_p_holm",
                "paired_wilcoxon_p_holm", "best_after_first", "paired_ndcg_minus_best", "best_ci95",
                "best_t_p_holm", "best_wilcoxon_p_holm",
                "median_popularity", "share_top10pct", "chosen",
                "valid_ndcg", "epochs", "trials", "search_minutes", "final_minutes", "users",
                "health", "seeds", "ndcg_seed_sd", "ndcg_seed_min", "ndcg_seed_max",
                "paired_seed_sd", *[f"{m} {x}" for m in STANDARD for x in ("mean", "ci95")],
                "paired_tost_p", "best_tost_p"])
    num = lambda x: "" if x is None or math.isnan(x) else f"{x:.6f}"  # noqa: E731
    for r in rows:
        d, p, b = r.get("paired_ndcg"), r.get("paired_p"), r.get("best")
        w.writerow([r["model"], *[f"{r[m][i]:.6f}" if m in r else "" for m in TABLE
                                  for i in (0, 1)],
                    *([f"{d[0]:.6f}", f"{d[1]:.6f}"] if d else ["", ""]),
                    *([f"{x:.6g}" for x in p] if p else ["", ""]),
                    best_of(rows) or "",  # what the next four compare with, on every row
                    *([f"{x:.6f}" for x in b["diff"]] + [f"{x:.6g}" for x in b["p"]] if b
                      else ["", "", "", ""]),
                    f"{r['median_popularity']:.1f}",
                    f"{r['share_top10pct']:.4f}", r["chosen"], f"{r['valid_ndcg']:.6f}",
                    r["epochs"], r["trials"], f"{r['search_minutes']:.2f}",
                    f"{r['final_minutes']:.2f}", r["users"], r.get("health", ""),
                    r.get("seeds", 1), *map(num, r.get("seed_spread") or (None,) * 3),
                    num(r.get("paired_seed_sd")),
                    *[f"{r[m][i]:.6f}" if m in r else "" for m in STANDARD for i in (0, 1)],
                    num(r.get("paired_tost_p")), num(b["tost_p"] if b else None)])
    return buf.getvalue()


def seeds_paired_csv(pairs: list[dict]) -> str:
    from evaluation.seeds import paired_csv

    return paired_csv(pairs)
