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
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import publish, stamp  # noqa: E402
from evaluation.tables import verdict  # noqa: E402

FAMILY = ("autorec", "ohns-autorec", "ns-autorec", "nce-autorec")  # the paper's models
FLOOR = "popularity"  # a reference, not a baseline anyone would ship
ENSEMBLE = "ensemble"  # experiment/run.py --ensemble's row: the listed models combined, no baseline


def is_baseline(model: str) -> bool:
    """A table row that competes as a baseline: not the family, the floor or an ensemble."""
    return model not in FAMILY and model not in (FLOOR, ENSEMBLE)


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"{path}: missing; pass a folder written by experiment/run.py "
                         "(with table.csv and paired.csv)")
    with path.open() as f:
        return list(csv.DictReader(f))


def ndcg_ci(table: dict, model: str) -> tuple[float, float]:
    """(mean, 95% CI) of ``model``'s test NDCG in an experiment's table.csv rows."""
    return float(table[model]["NDCG mean"]), float(table[model]["NDCG ci95"])


def summarise(folder: Path) -> dict:
    """The comparison of one experiment's NCE-AutoRec with AutoRec and the best baseline."""
    table = {r["model"]: r for r in read_csv(folder / "table.csv")}
    # with --seeds, paired.csv has each seed's rows beside the pooled one: the verdicts read
    # the pooled (an older paired.csv has no seed column: its rows are the only seed's)
    paired = {(r["label"], r["metric"]): r for r in read_csv(folder / "paired.csv")
              if r["reference"] == "nce-autorec" and r.get("seed", "pooled") == "pooled"}
    missing = [m for m in ("nce-autorec", "autorec") if m not in table]
    baselines = [m for m in table if is_baseline(m)]
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
        "ndcg": {m: ndcg_ci(table, m)
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


# what an experiment's name may add to its set's: ``experiment-ml-100k-levers`` ran on ml-100k
SUFFIXES = ("-levers", "-modes", "-start", "-ensemble", "-wide", "-width", "-top")


def dataset_of(folder: Path) -> str:
    """``experiment-ml-100k-levers`` -> ``ml-100k``: the set an experiment ran on, by its name."""
    name = folder.name.removeprefix("experiment-")
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def protocol_folders(folders: list[Path]) -> dict[str, Path]:
    """Per set, the protocol experiment its levers experiment is read beside: ``experiment-SET``
    (the protocol grid, which holds the modes), else ``experiment-SET-modes`` (the older runs
    that searched the modes apart)."""
    out: dict[str, Path] = {}
    for suffix in ("-modes", ""):  # the plain name last: it wins where both are given
        out.update({dataset_of(f): f for f in folders
                    if f.name.removeprefix("experiment-") == dataset_of(f) + suffix})
    return out


def paired_diff(paired: list[dict], a: str, b: str) -> tuple[float, float, dict] | None:
    """``a`` minus ``b`` (test NDCG, paired per user, pooled over seeds) from whichever of the
    experiment's comparisons holds the pair, with its row; None where none does."""
    for r in paired:
        if r["metric"] != "NDCG" or r.get("seed", "pooled") != "pooled":
            continue
        if (r["reference"], r["label"]) == (a, b):
            return float(r["mean_difference"]), float(r["ci95"]), r
        if (r["reference"], r["label"]) == (b, a):
            return -float(r["mean_difference"]), float(r["ci95"]), r
    return None


def summarise_levers(folder: Path, protocol: Path | None) -> dict:
    """Issue 32's reading of a levers experiment (benchmarks/grids/levers.yaml) beside the
    protocol experiment of the same set (same prepared data, so the same validation users): the
    strongest AutoRec-family row of the two, chosen by validation NDCG, against the best baseline
    by test NDCG of the experiment it comes from (the bar only rises that way), and the NCE head's
    increment over AutoRec searched over the same levers; beside them the paper's NCE-AutoRec of
    the protocol experiment. A protocol row is a candidate only where its finals ran with as many
    seeds as the levers experiment's."""
    def read(f: Path) -> tuple[dict, list[dict]]:
        return {r["model"]: r for r in read_csv(f / "table.csv")}, read_csv(f / "paired.csv")

    exps = {"levers": read(folder), **({"protocol": read(protocol)} if protocol else {})}
    table, paired = exps["levers"]
    if not {"nce-autorec", "autorec"} <= set(table) or not [
            m for m in table if is_baseline(m)]:
        raise SystemExit(f"{folder}: a levers experiment needs nce-autorec, autorec and at least "
                         "one baseline (its --models)")
    # a protocol row competes only with as many final seeds as the levers experiment's: a choice
    # retrained with one seed (older runs, before --seeds and the fixed regularisation) is not
    # the same evidence, and its experiment's paired rows then lack the pooled comparison
    seeds = {e: {m: int(r.get("seeds") or 1) for m, r in t.items()} for e, (t, _) in exps.items()}
    need = seeds["levers"].get("nce-autorec", 1)
    candidates = [(e, m) for e, (t, _) in exps.items() for m in t if m in FAMILY
                  and t[m].get("valid_ndcg") and (e == "levers" or seeds[e][m] >= need)]
    where, strongest = max(candidates, key=lambda c: float(exps[c[0]][0][c[1]]["valid_ndcg"]))
    st, sp = exps[where]
    best = max((m for m in st if is_baseline(m)),
               key=lambda m: float(st[m]["NDCG mean"]))
    vs_best, increment = paired_diff(sp, strongest, best), paired_diff(paired, "nce-autorec",
                                                                       "autorec")
    out = {"experiment": folder.name.removeprefix("experiment-"), "dataset": dataset_of(folder),
           "seeds": int(table["nce-autorec"].get("seeds") or 1),
           "strongest": strongest, "strongest_from": where,
           "strongest_chosen": st[strongest]["chosen"],
           "strongest_valid_ndcg": float(st[strongest]["valid_ndcg"]),
           "strongest_ndcg": ndcg_ci(st, strongest), "best_baseline": best,
           "best_baseline_chosen": st[best]["chosen"], "best_baseline_ndcg": ndcg_ci(st, best),
           "strongest_minus_best": vs_best[:2] if vs_best else None,
           "nce_chosen": table["nce-autorec"]["chosen"], "autorec_chosen": table["autorec"]["chosen"],
           "nce_ndcg": ndcg_ci(table, "nce-autorec"), "autorec_ndcg": ndcg_ci(table, "autorec"),
           "increment": increment[:2] if increment else None,
           "increment_p_holm": (float(increment[2]["t_p_holm"]),
                                float(increment[2]["wilcoxon_p_holm"])) if increment else None,
           "top10_share": {m: float(table[m]["share_top10pct"])
                           for m in ("nce-autorec", "autorec")}}
    if protocol is not None:
        ptable = exps["protocol"][0]
        pbase = [m for m in ptable if is_baseline(m)]
        pbest = max(pbase, key=lambda m: float(ptable[m]["NDCG mean"])) if pbase else None
        out["paper_nce"] = ndcg_ci(ptable, "nce-autorec") if "nce-autorec" in ptable else None
        out["paper_nce_chosen"] = ptable.get("nce-autorec", {}).get("chosen")
        # the protocol's best baseline must be in the levers experiment, or the bar is too low
        out["protocol_best_baseline"] = pbest
        out["protocol_best_in_levers"] = pbest in table
    out["goal"] = {
        "strongest_at_or_above_best_baseline": bool(vs_best and vs_best[0] + vs_best[1] >= 0),
        "nce_increment_positive": bool(increment and increment[0] - increment[1] > 0)}
    return out


def table_pair(table: dict, a: str, b: str) -> tuple[float, float, float] | None:
    """``a`` minus ``b`` in test NDCG (paired per user, pooled over seeds: mean, 95% CI) and the
    equivalence test's p (``evaluation.significance.tost_p``, ±1% of the reference's NDCG; NaN
    where the table predates it), read from an experiment's table.csv: each row carries its
    difference from the first model and from the best after the first. None where the
    experiment did not pair the two."""
    first = next(iter(table))
    best = next((r["best_after_first"] for r in table.values() if r.get("best_after_first")), "")
    columns = {first: ("paired_ndcg_minus_first", "paired_ci95", "paired_tost_p"),
               best: ("paired_ndcg_minus_best", "best_ci95", "best_tost_p")}
    for row, reference, sign in ((a, b, 1.0), (b, a, -1.0)):
        if reference not in columns or row not in table:
            continue
        d, ci, p = (table[row].get(c) for c in columns[reference])
        if d:  # empty for the reference itself
            return sign * float(d), float(ci), float(p) if p else math.nan
    return None


def final_in_process_rows(folder: Path) -> list[dict]:
    """Baselines fitted beside an experiment by ``benchmarks/final_in_process.py`` (say EASE on
    Gowalla, whose dense B the pipeline cannot carry here): its ``*-final*.json`` files, one row
    per model with its test NDCG and, per experiment model its fit was paired with (the
    ``--paired`` labels' model, e.g. NCE-AutoRec's seeds), the difference (this one minus it)."""
    rows: dict[str, dict] = {}
    for f in sorted(folder.glob("*-final*.json")):
        d = json.loads(f.read_text())
        row = rows.setdefault(d["model"], {
            "model": d["model"], "ndcg": (d["test"]["ndcg"]["mean"], d["test"]["ndcg"]["ci95"]),
            "chosen": ", ".join(f"{k}={v}" for k, v in sorted(d["settings"].items())),
            "minus": {}, "source": f.name})
        if (d["test"]["ndcg"]["mean"], d["test"]["ndcg"]["ci95"]) != row["ndcg"]:
            raise SystemExit(f"{f}: {d['model']}'s test NDCG differs from {row['source']}'s; "
                             "the files must hold one fit, paired with different models")
        pair = d.get("paired") or {}
        if pair.get("ndcg"):  # "nce-autorec seed 0 + nce-autorec seed 1": nce-autorec
            other = pair["label"].split(" + ")[0].split(" seed ")[0]
            row["minus"][other] = (pair["ndcg"]["mean"], pair["ndcg"]["ci95"], math.nan)
    return list(rows.values())


def same_finals_increment(table: dict, others: list[Path]) -> tuple[float, float, float] | None:
    """NCE-AutoRec minus AutoRec from another experiment of the set whose two rows are the same
    finals as ``table``'s (same chosen points, same test NDCG to the digit): an experiment
    resumed with ``--ensemble`` compares every model with the ensemble, not the two heads with
    each other, while the run it resumed did."""
    key = lambda t: tuple((t[m]["chosen"], t[m]["NDCG mean"])  # noqa: E731
                          for m in ("nce-autorec", "autorec"))
    for f in others:
        t = {r["model"]: r for r in read_csv(f / "table.csv")}
        if {"nce-autorec", "autorec"} <= set(t) and key(t) == key(table):
            got = table_pair(t, "nce-autorec", "autorec")
            if got:
                return got
    return None


def member_point(folder: Path, member: str, table: dict) -> str | None:
    """An ensemble member's settings: a model's row's choice, or for MODEL#K (``--ensemble-top``'s
    candidate) that model's K-th trial by validation NDCG once its choice is left out, read from
    the experiment's ``search.md`` (its trials best first); None where neither says."""
    model, _, k = member.partition("#")
    if model not in table:
        return None
    if not k:
        return table[model]["chosen"]
    search = folder / "search.md"
    text = search.read_text() if search.is_file() else ""
    section = text.split(f"## {model}:", 1)[1].split("\n## ", 1)[0] if f"## {model}:" in text \
        else ""
    points = [cells[2].strip() for line in section.splitlines()
              if len(cells := line.split("|")) > 3 and cells[1].strip().isdigit()]
    others = [p for p in points if p != table[model]["chosen"]]
    return others[int(k) - 2] if k.isdigit() and 2 <= int(k) <= len(others) + 1 else None


def summarise_set(folder: Path, protocol: Path | None, others: list[Path] = ()) -> dict:
    """Issue 57's reading of one set: the paper's NCE-AutoRec (from the set's protocol
    experiment, where given), every row of the set's final experiment (the family searched with
    its levers and start, an ensemble of it where one was run, every baseline), the strongest
    family configuration chosen by validation NDCG (an ensemble of family models competes: it
    is chosen on the same validation users), the best baseline by test NDCG (the bar only rises
    that way), the strongest minus it and the NCE head's increment over AutoRec with the same
    levers, each with its verdict: above / below where the CI excludes 0, level only where the
    equivalence test (±1% of the reference's NDCG, TOST at 5%) says so, else not significantly
    above / below."""
    table = {r["model"]: r for r in read_csv(folder / "table.csv")}
    ptable = {r["model"]: r for r in read_csv(protocol / "table.csv")} if protocol else {}
    # every baseline of the set: the protocol experiment's that the final one did not rerun come
    # along unpaired (they may still be the best, and then the difference is not given)
    extra = final_in_process_rows(folder) + [
        {"model": m, "ndcg": ndcg_ci(ptable, m), "chosen": ptable[m]["chosen"],
         "minus": {}, "source": protocol.name} for m in ptable
        if is_baseline(m) and m not in table]
    # an ensemble is the family's configuration only where every member it chose is the family's
    # (its "chosen" reads "members=nce-autorec+autorec"; "nce-autorec#2" is that model's
    # second-best trial, an --ensemble-top candidate)
    members = table.get(ENSEMBLE, {}).get("chosen", "").removeprefix("members=").split("+")
    family_ensemble = ENSEMBLE in table and all(m.split("#")[0] in FAMILY for m in members)
    family = [m for m in table if m in FAMILY or (m == ENSEMBLE and family_ensemble)]
    baselines = [m for m in table if is_baseline(m)] + [e["model"] for e in extra]
    if not {"nce-autorec", "autorec"} <= set(table) or not baselines:
        raise SystemExit(f"{folder}: a set's experiment needs nce-autorec, autorec and at least "
                         "one baseline (its --models)")
    ndcg = {m: ndcg_ci(table, m) for m in table} | {e["model"]: e["ndcg"] for e in extra}
    valid = {m: float(table[m]["valid_ndcg"]) for m in family if table[m].get("valid_ndcg")}
    single = max((m for m in valid if m != ENSEMBLE), key=valid.get)
    # an ensemble of several members was chosen over each of them alone on the same validation
    # users (its own subset search), which may be more users than a trial's --valid-sample: where
    # the best single model is a member, the ensemble is the stronger without comparing numbers
    # taken over different users
    strongest = (ENSEMBLE if family_ensemble and len(members) > 1 and single in members
                 else max(valid, key=valid.get))
    best = max(baselines, key=lambda m: ndcg[m][0])

    def against_best(model: str) -> tuple[float, float, float] | None:
        got = table_pair(table, model, best)
        if got is None:  # a baseline fitted beside the experiment, paired with this model
            e = next((e for e in extra if e["model"] == best), {"minus": {}})
            pair = e["minus"].get(model)
            got = pair and (-pair[0], *pair[1:])
        return got or None

    def read(pair: tuple[float, float, float] | None) -> dict | None:
        """The difference, its TOST p (None where not computed: JSON has no NaN), verdict."""
        if not pair:
            return None
        p = None if math.isnan(pair[2]) else pair[2]
        return {"diff": pair[:2], "tost_p": p, "verdict": verdict(pair[:2], p)}

    def chosen(m: str) -> str:
        if m not in table:
            return next(e["chosen"] for e in extra if e["model"] == m)
        if m == ENSEMBLE:  # each member named by its settings
            points = {x: member_point(folder, x, table) for x in members}
            return " + ".join(f"{x} ({points[x]})" if points[x] else x for x in members)
        return table[m]["chosen"]

    def kind(m: str) -> str:
        if m == ENSEMBLE:
            return "ensemble" if family_ensemble else "mixed ensemble"
        return "family" if m in FAMILY else "floor" if m == FLOOR else "baseline"

    out = {"dataset": dataset_of(folder), "experiment": folder.name.removeprefix("experiment-"),
           "seeds": int(table["nce-autorec"].get("seeds") or 1),
           "rows": [{"model": m, "ndcg": ndcg[m], "valid_ndcg": valid.get(m),
                     "chosen": chosen(m), "kind": kind(m),
                     "from": next((e["source"] for e in extra if e["model"] == m), None)}
                    for m in [*table, *(e["model"] for e in extra)]],
           "strongest": strongest, "strongest_single": single, "best_baseline": best,
           "strongest_minus_best": read(against_best(strongest)),
           "single_minus_best": read(against_best(single)),
           "increment": read(table_pair(table, "nce-autorec", "autorec")
                             or same_finals_increment(table, list(others))),
           "paper_nce": None, "paper_nce_chosen": None}
    if "nce-autorec" in ptable:
        out["paper_nce"] = ndcg_ci(ptable, "nce-autorec")
        out["paper_nce_chosen"] = ptable["nce-autorec"]["chosen"]
    return out


def render_sets(rows: list[dict]) -> list[str]:
    pm = lambda x, signed=False: "–" if x is None else (  # noqa: E731
        f"{x[0]:+.4f} ± {x[1]:.4f}" if signed else f"{x[0]:.4f} ± {x[1]:.4f}")
    said = lambda r: "–" if r is None else (  # noqa: E731
        f"{pm(r['diff'], True)}: **{r['verdict']}**"
        + ("" if r["tost_p"] is None or r["verdict"] in ("above", "below")
           else f" (TOST p {r['tost_p']:.2g})"))
    lines = ["", "## Per set: the family at its strongest against every baseline (issue 57)", "",
             "Each set's final experiment: the AutoRec family searched with its width, levers "
             "and start (extensions beyond the paper), an ensemble of family models where one "
             "was run (`--ensemble`, an extension), every baseline tuned on validation, 3 seeds "
             "per final, test NDCG (the paper's) with 95% CIs over users and seeds on "
             "Satterthwaite's t. Strongest: the family configuration (ensemble included) with "
             "the best validation NDCG; best baseline: by test NDCG. Verdicts of a paired "
             "difference: above / below where its CI excludes 0; level only where the two "
             "one-sided tests put it within ±1% of the reference's NDCG; otherwise not "
             "significantly above / below. The paper's NCE-AutoRec: the set's protocol "
             "experiment (width 200, no levers; not paired with the rest). Baselines marked † "
             "were fitted apart from the set's experiment: the protocol experiment's (unpaired) "
             "or `benchmarks/final_in_process.py`'s (paired with NCE-AutoRec's seeds).", "",
             "| set | the paper's NCE-AutoRec | strongest family configuration (valid) | "
             "strongest − best baseline | best single family model | single − best baseline | "
             "baselines | NCE head's increment (NCE − AutoRec, same levers) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        row = {x["model"]: x for x in r["rows"]}
        s, one = row[r["strongest"]], row[r["strongest_single"]]
        lines.append(
            f"| {r['dataset']} ({r['experiment']}) | {pm(r['paper_nce'])} "
            f"| {s['model']} {pm(s['ndcg'])} ({s['chosen']}; valid {s['valid_ndcg']:.4f}) "
            f"| {said(r['strongest_minus_best'])} "
            f"| {one['model']} {pm(one['ndcg'])} ({one['chosen']}) "
            f"| {said(r['single_minus_best'])} "
            f"| " + ", ".join(f"{x['model']} {x['ndcg'][0]:.4f}" + ("†" if x["from"] else "")
                              for x in r["rows"] if x["kind"] in ("baseline", "floor"))
            + f" | {said(r['increment'])} |")
    return lines


def render_levers(rows: list[dict]) -> list[str]:
    pm = lambda x, signed=False: "–" if x is None else (  # noqa: E731
        f"{x[0]:+.4f} ± {x[1]:.4f}" if signed else f"{x[0]:.4f} ± {x[1]:.4f}")
    yes = lambda flag: "yes" if flag else "**no**"  # noqa: E731
    lines = ["", "## The AutoRec family with the levers (issue 32; extensions beyond the paper)", "",
             "From each levers experiment (`benchmarks/grids/levers.yaml`: width x lambda, then "
             "the confidence on positives, input dropout, the NCE head's scale, beta and a "
             "fine-tune mode one at a time, then together; every choice on validation). "
             "Strongest: the AutoRec-family row with the best validation NDCG in the levers "
             "experiment or the protocol experiment of the same set (same validation users), "
             "named with its experiment. Best baseline: the baseline with the best test NDCG in "
             "the experiment the strongest row comes from. The paper's NCE-AutoRec: the protocol "
             "experiment's (width 200, no levers).", "",
             "| set | seeds | the paper's NCE-AutoRec | strongest family row (chosen) | best baseline "
             "(chosen) | strongest − best baseline | NCE-AutoRec (levers) | AutoRec (levers) "
             "| NCE head's increment: NCE − AutoRec, same levers |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r.get("increment_p_holm")
        lines.append(
            f"| {r['dataset']} | {r['seeds']} | {pm(r.get('paper_nce'))} "
            f"| {r['strongest']} {pm(r['strongest_ndcg'])} ({r['strongest_from']}: "
            f"{r['strongest_chosen']}; valid {r['strongest_valid_ndcg']:.4f}) "
            f"| {r['best_baseline']} {pm(r['best_baseline_ndcg'])} ({r['best_baseline_chosen']}) "
            f"| {pm(r['strongest_minus_best'], True)} "
            f"| {pm(r['nce_ndcg'])} ({r['nce_chosen']}) | {pm(r['autorec_ndcg'])} "
            f"({r['autorec_chosen']}) | {pm(r['increment'], True)}"
            + (f" (p {p[0]:.2g} t, {p[1]:.2g} Wilcoxon, Holm)" if p else "") + " |")
    lines += ["", "Goal (issue 32), per set:", "",
              "| set | strongest family row at or above the best baseline | NCE head's increment "
              "CI > 0 | the protocol's best baseline in the levers experiment |",
              "|---|---|---|---|"]
    for r in rows:
        g = r["goal"]
        lines.append(f"| {r['dataset']} | {yes(g['strongest_at_or_above_best_baseline'])} "
                     f"| {yes(g['nce_increment_positive'])} "
                     f"| {r.get('protocol_best_baseline') or '–'}: "
                     f"{yes(r.get('protocol_best_in_levers', True))} |")
    return lines


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
    ap.add_argument("--sets", nargs="+", type=Path, default=[],
                    help="per set, its final experiment for issue 57's section (the family with "
                         "its levers, an ensemble, every baseline; the paper's NCE-AutoRec from "
                         "the set's protocol folder among FOLDERS) (default: none)")
    ap.add_argument("--beside", nargs="+", type=Path, default=[],
                    help="more experiments of those sets, read only for the NCE head's increment "
                         "where a set's experiment (resumed with --ensemble, say) no longer "
                         "pairs NCE-AutoRec with AutoRec and one of these holds the same finals "
                         "(default: none)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/nce_report"),
                    help="writes OUT.md and OUT.json (default: %(default)s)")
    args = ap.parse_args(argv)
    # a levers experiment is read twice: as any experiment (its NCE-AutoRec against its AutoRec
    # and best baseline) and for issue 32's section, beside the protocol experiment of its set
    rows = [summarise(f) for f in args.folders]
    protocol = protocol_folders(args.folders)
    levers = [summarise_levers(f, protocol.get(dataset_of(f))) for f in args.folders
              if f.name.endswith("-levers")]
    sets = [summarise_set(f, protocol.get(dataset_of(f)),
                          [o for o in [*args.folders, *args.beside]
                           if dataset_of(o) == dataset_of(f) and o != f])
            for f in args.sets]
    body = render(rows) + (render_levers(levers) if levers else []) \
        + (render_sets(sets) if sets else [])
    run = stamp("nce_report.py", argv)
    lines = ["# NCE-AutoRec against AutoRec and the best baseline, per experiment", "",
             f"Command: `{run['command']}`  ", f"Date: {run['date']}.  ",
             "Test NDCG with 95% CIs; differences are paired per user (NCE-AutoRec minus the "
             "other, 95% CI; where given, p-values of the paired t-test and the Wilcoxon "
             "signed-rank test over users, Holm-corrected over the experiment's NDCG comparisons); "
             "every model chosen on validation (`experiment/run.py`). "
             "The goal's reading is in `benchmarks/nce_report.py`.", ""] + body
    publish(args.out, {"run": run, "experiments": rows, "levers": levers, "sets": sets}, lines)
    print("\n".join(body))


if __name__ == "__main__":
    main()
