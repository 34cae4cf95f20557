"""6. the experiment's report: the table's rows (``table_rows``) and table.md, search.md, the
paper's figures from the trials, the metrics pooled over seeds, and the table and plots logged
to the experiment's MLflow run. The cells and table.csv are evaluation/tables.py's."""

from __future__ import annotations

import math
from pathlib import Path

from evaluation.seeds import EQUIVALENCE
from evaluation.significance import tost_p
from evaluation.tables import best_of, ci_cell, fmt_point, p_pair, spread, standard_md, verdict
from experiment.records import trial_results
from prepared.protocol import STANDARD, TABLE
from training.validate import COLLAPSED_RANK, HEALTHY


def table_rows(state: dict, rows: list[dict], pop: dict | None = None,
               pairs: list[dict] = ()) -> list[dict]:
    """One row per model: test metrics (mean, CI) of warm users, its NDCG minus the first
    model's per user (paired: mean, CI; Holm-corrected t-test and Wilcoxon p-values) and minus the
    best after the first (``best``, the same; None for the first and the best themselves), the
    popularity of what it recommends, the choice and the times. With seeds (evaluation/seeds.py's
    pooled rows) the metrics and pairs are the pooled ones, and ``seeds``, ``seed_spread`` (the
    NDCG's sd, min, max over seeds) and the paired NDCG's ``seed_sd`` come along; the per-seed
    pairs are paired.csv's, not the table's."""
    # evaluate.py's pairs are reference - other; the table says other - reference
    ndcg = {(p.get("comparison", "first"), p["label"]): p for p in pairs if p["metric"] == "NDCG"
            and p.get("seed", "pooled") == "pooled"}
    means = {r["label"]: r["mean"] for r in rows if r["metric"] == "NDCG" and r["group"] == "warm"}

    def against(comparison: str, label: str) -> dict | None:
        p = ndcg.get((comparison, label))
        if not p:
            return None
        margin = EQUIVALENCE * means.get(p["reference"], math.nan)
        return {"reference": p["reference"], "diff": (-p["mean_difference"], p["ci95"]),
                "p": (p.get("t_p_holm", math.nan), p.get("wilcoxon_p_holm", math.nan)),
                "seed_sd": p.get("seed_sd", math.nan),
                "tost_p": tost_p(-p["mean_difference"], p.get("se", math.nan),
                                 p.get("df", math.inf), margin)}

    out = []
    for model, s in state["models"].items():
        if "evaluation_label" not in s:
            continue
        mine = {r["metric"]: r for r in rows if r["label"] == s["evaluation_label"]
                and r["group"] == "warm"}
        finals = (s.get("finals") or {"": s["final"]}).values()
        nd = mine.get("NDCG", {})
        out.append({"model": model, "chosen": fmt_point(s["chosen"]["point"]),
                    "valid_ndcg": s["chosen"]["valid_ndcg"], "epochs": s["final"]["epochs_run"],
                    "trials": s["chosen"]["trials"],
                    "search_minutes": s["chosen"]["search_seconds"] / 60,
                    # every seed's retraining
                    "final_minutes": sum(f.get("wall_seconds", 0.0) for f in finals) / 60,
                    "seeds": nd.get("seeds", 1),
                    "seed_spread": tuple(nd.get(k, math.nan) for k in ("seed_sd", "seed_min",
                                                                        "seed_max")),
                    "users": next(iter(mine.values()))["users"] if mine else 0,
                    # the chosen trial's (training/validate.py health); "" where unchecked
                    "health": s["chosen"].get("health") or "",
                    "median_popularity": (pop or {}).get(s["evaluation_label"], {}).get(
                        "median_popularity", float("nan")),
                    "share_top10pct": (pop or {}).get(s["evaluation_label"], {}).get(
                        "share_top10pct", float("nan")),
                    "paired_ndcg": (against("first", s["evaluation_label"]) or {}).get("diff"),
                    "paired_p": (against("first", s["evaluation_label"]) or {}).get("p"),
                    "paired_seed_sd": (against("first", s["evaluation_label"]) or {}).get(
                        "seed_sd", math.nan),
                    "paired_tost_p": (against("first", s["evaluation_label"]) or {}).get(
                        "tost_p", math.nan),
                    "best": against("best", s["evaluation_label"]),
                    **{m: (mine[m]["mean"], mine[m]["ci95"]) for m in (*TABLE, *STANDARD)
                       if m in mine}})
    return out



def table_md(rows: list[dict], title: str) -> str:
    first = rows[0]["model"] if rows else ""
    best = best_of(rows)
    against_best = ([f"NDCG − {best}, paired", f"p vs {best} (t / Wilcoxon)", f"vs {best}"]
                    if best else [])
    head = ["model", *TABLE, f"NDCG − {first}, paired", f"p vs {first} (t / Wilcoxon)",
            f"vs {first}",
            *against_best, "median pop.", "top-10% share",
            "chosen (validation)", "valid NDCG", "epochs", "trials", "search min", "final min",
            "health"]
    seeds = max((r.get("seeds", 1) for r in rows), default=1)
    if seeds > 1:
        head += ["seeds", "NDCG seed sd (min–max)"]
    lines = [f"# {title}", "", "Test metrics of warm users, mean ± 95% CI; models chosen by "
             "validation NDCG and retrained on train+valid"
             + (f", each with {seeds} seeds: the mean over seeds, its CI covering users and "
                "seeds (t √(Var over users of the per-user seed mean / users + Var of the "
                "per-seed means / seeds), t Student's 97.5% quantile on Satterthwaite's degrees "
                "of freedom: conservative, it counts the seed noise at most twice), "
                "the NDCG's seed spread in its own column; the first seed's model is the "
                "registered one" if seeds > 1 else "")
             + ". NDCG − first, paired: the mean over "
             "users of (this model's NDCG − the first model's) with its 95% CI"
             + (" (seed s of one against seed s of the other, pooled as above; paired.csv has "
                "each seed's too)" if seeds > 1 else "")
             + "; where the CI excludes 0 the two differ, and only there does one beat the "
             "other. vs: above or below where that CI excludes 0; level only where the two one-"
             f"sided tests (TOST, 5%) put the difference within ±{EQUIVALENCE:.0%} of the "
             "reference's NDCG; else not significantly above / below (neither shown). "
             "p: two-sided p-values over users of the paired t-test "
             "and the Wilcoxon signed-rank test on the same per-user NDCG differences"
             + (" (each user's mean over seeds)" if seeds > 1 else "") + ", "
             "Holm-corrected over every NDCG comparison of the table"
             + (f" (against {first} and against {best}, the best after it by test NDCG)"
                if best else "") + "; paired.csv has them uncorrected too, and for Recall@50. "
             "Median pop.: the median training "
             "popularity of the recommended items; top-10% share: the share of recommendations "
             "from the 10% most popular items. Health: the chosen trial's on validation: ok, "
             "below-popularity (its best validation NDCG not above the popularity baseline's "
             "on the same users) or collapsed (its code's effective rank below "
             f"{COLLAPSED_RANK:g}); an unhealthy model is not registered as @champion unless "
             "--allow-unhealthy; – where not checked (closed-form fits).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [ci_cell(r, m) for m in TABLE]
        d = r.get("paired_ndcg")
        cells += [f"{d[0]:+.4f} ± {d[1]:.4f}" if d else "–", p_pair(r.get("paired_p")),
                  verdict(d, r.get("paired_tost_p"))]
        if best:
            b = r.get("best")
            cells += [f"{b['diff'][0]:+.4f} ± {b['diff'][1]:.4f}" if b else "–",
                      p_pair(b and b["p"]), verdict(b and b["diff"], b and b["tost_p"])]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + f" | {r['median_popularity']:,.0f}"
                     f" | {r['share_top10pct']:.3f} | {r['chosen']} | "
                     f"{r['valid_ndcg']:.4f} | {r['epochs']} | {r['trials']} | "
                     f"{r['search_minutes']:.1f} | {r['final_minutes']:.1f} | "
                     + (f"**{r['health']}**" if r.get("health") not in ("", None, HEALTHY)
                        else r.get("health") or "–") + " |"
                     + (f" {r.get('seeds', 1)} | {spread(r.get('seed_spread'))} |"
                        if seeds > 1 else ""))
    lines += standard_md(rows, seeds)
    return "\n".join(lines) + "\n"



def search_md(state: dict, models: list[str], name: str) -> str:
    """search.md: per model, every finished trial, best validation NDCG first (what the next
    stage of a staged search, ``--stop-after search``, reads to grow the grid)."""
    out = [f"# {name}: the search", "",
           "Every finished trial by validation NDCG, best first (one seed, the search's); the "
           "choice may differ where the seeds settled it (``reseed_choice``: the table's "
           "'chosen'). Nothing here was read on test.", ""]
    for m in models:
        c = state["models"][m]["chosen"]
        out += [f"## {m}: {c['finished']} of {c['trials']} trial(s) finished", "",
                "| rank | point | valid NDCG | best epoch |", "|---|---|---|---|"]
        ranked = sorted(c["all"], key=lambda r: -r["valid_ndcg"])
        out += [f"| {i} | {fmt_point(r['point'])} | {r['valid_ndcg']:.4f} | {r['best_epoch']} |"
                for i, r in enumerate(ranked, 1)]
        out.append("")
    return "\n".join(out)


def seed_label(model: str, seed: int, seeds: int) -> str:
    """The evaluation label of one seed's lists: the model itself with one seed (as before
    --seeds), ``MODEL seed S`` with several (each seed's metrics land in its own run)."""
    return model if seeds == 1 else f"{model} seed {seed}"


def pool_over_seeds(spark, evaluation: Path, labels: dict[str, list[str]],
                    seeds: list[int]) -> tuple[list[dict], list[dict]]:
    """The table's metric rows and paired rows pooled over seeds (evaluation/seeds.py) from the
    evaluation's per-user values: the same comparisons as evaluate.py makes of one seed each,
    the first model minus each other and, with three or more, the best after the first (by the
    pooled test NDCG) minus each remaining one."""
    from evaluation.paired import PAIRED, best_other
    from evaluation.seeds import pooled_metrics, pooled_pairs

    users = spark.read.parquet(str(evaluation / "per_user"))
    rows = pooled_metrics(users, labels, [*TABLE, *STANDARD])
    models = list(labels)
    plan = [("first", models[0], models[1:])] if len(models) > 1 else []
    best = best_other(rows, models)
    others = [m for m in models[1:] if m != best]
    if best is not None and others:
        plan.append(("best", best, others))
    pairs = pooled_pairs(users, labels, seeds, plan, list(PAIRED)) if plan else []
    return rows, pairs


def pool_popularity(pop: dict | None, labels: dict[str, list[str]]) -> dict:
    """Per model, the mean over its seeds of each popularity figure of evaluate.py (keyed by
    evaluation label): with one seed the figures themselves."""
    pop = pop or {}
    out = {}
    for model, ls in labels.items():
        mine = [pop[x] for x in ls if x in pop]
        if mine:
            out[model] = {k: sum(p[k] for p in mine) / len(mine) for k in mine[0]}
    return out


def best_by(results: list[tuple[dict, dict]], key: str) -> dict:
    """The best validation NDCG at each value of ``key`` (over every other setting)."""
    out: dict = {}
    for p, s in results:
        if key in p:
            out[p[key]] = max(out.get(p[key], -1.0), s["best_valid_ndcg"])
    return out


def figures(root: Path, points: dict[str, list[dict]]) -> dict[str, bytes]:
    """The paper's figures that the search answers: validation NDCG per optimisation mode, against
    N (NS heads) and against beta, and validation NDCG against wall time per mode (convergence);
    each drawn for the models whose grid varied that setting."""
    from evaluation import plots
    from models.registry import model_class
    from training.train import read_model_file

    # a grid point names only what it sets (the protocol grid sets mode only where it searches
    # the fine-tune modes): the model's defaults fill the rest, so its joint-mode points count
    # as joint. Trials are found by the points as given (their names).
    defaults = {m: model_class(m).defaults() for m in points}
    results = {m: [({**defaults[m], **p}, s) for p, s in trial_results(root, m, pts)]
               for m, pts in points.items()}
    points = {m: [{**defaults[m], **p} for p in pts] for m, pts in points.items()}
    varied = lambda m, k: len({p[k] for p in points[m] if k in p}) > 1
    out = {}
    for key, name, label, log_x in (("mode", "ndcg_per_mode.png", "optimisation mode", False),
                                    ("num_negatives", "ndcg_against_n.png", "N (negatives)", True),
                                    ("beta", "ndcg_against_beta.png", "beta", False)):
        series = {m: best_by(results[m], key) for m in points if varied(m, key)}
        if series:
            out[name] = plots.png_bytes(plots.setting_effect(
                series, label, f"Best validation NDCG per {label} ({root.name})", log_x))
    curves = {}
    for m in points:
        if not varied(m, "mode"):
            continue
        for mode in dict.fromkeys(p["mode"] for p in points[m]):
            mine = [(p, s) for p, s in results[m] if p.get("mode") == mode]
            if not mine:
                continue
            p, s = max(mine, key=lambda r: r[1]["best_valid_ndcg"])
            history = read_model_file(s["model_path"]).get("history", [])
            t, y, clock = [], [], 0.0
            for rec in history:
                clock += rec.get("epoch_seconds", rec.get("train_seconds", 0.0))
                if "valid_ndcg" in rec:
                    t.append(clock)
                    y.append(rec["valid_ndcg"])
            curves[f"{m} {mode}"] = (t, y)
    if curves:
        out["convergence.png"] = plots.png_bytes(plots.convergence(
            curves, f"Validation NDCG against training time, best trial per mode ({root.name})"))
    return out


def log_report(uri: str, run_id: str, root: Path, rows: list[dict]) -> None:
    """The table and the evaluation's plots as artifacts of the experiment's run; per model its
    test NDCG as a metric (compare experiments in the UI)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for name in ("table.md", "table.csv", "paired.csv"):
        if (root / name).is_file():
            client.log_artifact(run_id, str(root / name))
    for plot in sorted([*(root / "evaluation").glob("*.png"), *(root / "figures").glob("*.png")]):
        client.log_artifact(run_id, str(plot), "plots")
    for r in rows:  # with seeds: pooled (the mean over seeds, the CI over users and seeds)
        if "NDCG" in r:
            client.log_metric(run_id, f"test_ndcg_{r['model']}", r["NDCG"][0])
            client.log_metric(run_id, f"test_ndcg_{r['model']}_ci95", r["NDCG"][1])
        if r.get("seeds", 1) > 1 and not math.isnan(r["seed_spread"][0]):
            client.log_metric(run_id, f"test_ndcg_{r['model']}_seed_sd", r["seed_spread"][0])
        if r.get("paired_ndcg"):  # this model minus the first, paired, Holm-corrected p-values
            key = f"test_paired_ndcg_{r['model']}_minus_first"
            client.log_metric(run_id, key, r["paired_ndcg"][0])
            client.log_metric(run_id, f"{key}_ci95", r["paired_ndcg"][1])
            for test, p in zip(("t_p_holm", "wilcoxon_p_holm"), r.get("paired_p") or ()):
                if not math.isnan(p):
                    client.log_metric(run_id, f"{key}_{test}", p)
    client.set_terminated(run_id, "FINISHED")
