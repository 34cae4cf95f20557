"""Quality check on real data: NCE-AutoRec against AutoRec on ml-100k, through the real entry points
(the ETL under spark-submit; training's ``run`` on a local Ray, tracked in a local SQLite MLflow).

    .venv/bin/python benchmarks/quality_ml100k.py [--shared ../shared/datasets]

``spark-submit etl/prepare.py`` prepares ml-100k (from ../shared, never copied here), then
``training/train.py``'s ``run`` trains AutoRec and NCE-AutoRec with their default hyperparameters
on a local Ray (2 workers). For each model: the best validation NDCG and Recall@50, and the
popularity (training positives) of the items it recommends in the validation users' top-50 lists
(training items excluded): median, mean, the share from the 10% most popular items, catalog
coverage. The paper's claim, checked here: NCE-AutoRec ranks better and recommends less popular
items. "Better" is the paired per-user difference of validation NDCG with its 95% CI and the
paired t-test's p-value (the same users, the same lists' truth): a difference whose CI includes 0
is "level", whatever its sign. One training seed per model: the CI covers the users only.
Results go to ``benchmarks/results/quality_ml100k.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from evaluation.popularity import popularity_summary  # noqa: E402
from infra.submit import spark_submit  # noqa: E402
from models.batch import sparse_rows  # noqa: E402
from models.registry import load_model_file  # noqa: E402
from prepared.metrics import hit_matrix, per_user  # noqa: E402
from prepared.reader import open_prepared  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.train import run  # noqa: E402

MODELS = ("autorec", "nce-autorec")


def top50(model_path: Path, prepared: Path) -> tuple[np.ndarray, list[np.ndarray]]:
    """(U, 50) top-50 item indices of the warm users with a validation item, and their
    validation items."""
    model = load_model_file(str(model_path))
    rows = pq.read_table(prepared / "rows").to_pandas()
    rows = rows[~rows["cold"] & (rows["valid_items"].map(len) > 0)]
    items, offsets = sparse_rows(list(rows["train_items"]))
    _, top = model.recommend(items, offsets, 50)
    return top.numpy(), [np.asarray(v) for v in rows["valid_items"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "quality_ml100k"))
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="quality-", dir=ROOT / "var" if (ROOT / "var").exists()
                                 else None))
    prepared = work / "ml-100k"
    cmd, env = spark_submit("etl/prepare.py", "--dataset", "ml-100k", "--input",
                            str(Path(args.shared) / "ml-100k" / "u.data"), "--output", str(prepared),
                            master="local[2]", driver_memory="2g")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    prep = open_prepared(str(prepared))
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'mlflow.db'}")
    results, per_user_ndcg, configs = {}, {}, {}
    for model in MODELS:
        cfg = TrainConfig(data=str(prepared), model=model, num_workers=args.workers,
                          run_name=f"quality-{model}", experiment="quality-ml100k",
                          output=str(work / "runs"))
        configs[model] = {k: v for k, v in cfg.resolved().items() if v is not None}
        s = run(cfg)
        recs, truth = top50(Path(s["model_path"]), prepared)
        ndcg = per_user(hit_matrix(recs, truth), np.array([len(t) for t in truth]))["NDCG"]
        per_user_ndcg[model] = ndcg
        results[model] = {"best_valid_ndcg": s["best_valid_ndcg"],
                          "ndcg_ci95": float(1.96 * ndcg.std() / np.sqrt(len(ndcg))),
                          "best_valid_recall_at_50": s["best_valid_recall_at_50"],
                          "best_epoch": s["best_epoch"], "epochs_run": s["epochs_run"],
                          "wall_seconds": s["wall_seconds"],
                          **popularity_summary(recs, prep.pop_train)}
        print(json.dumps({model: results[model]}), flush=True)
    a, n = results["autorec"], results["nce-autorec"]
    diff = paired(per_user_ndcg["nce-autorec"], per_user_ndcg["autorec"])
    checks = {"nce_ndcg_vs_autorec": diff["verdict"],
              "nce_median_popularity_below_autorec": n["median_popularity"] < a["median_popularity"]}
    write(results, checks, diff, args, configs)
    print(json.dumps({"paired": diff, **checks}))
    return 0


def paired(x: np.ndarray, y: np.ndarray) -> dict:
    """The paired per-user difference x - y: mean, 95% CI half-width (normal, ddof 0 as
    evaluation/evaluate.py), the paired t-test's p-value, and a verdict that calls a difference
    only where the CI excludes 0."""
    from evaluation.significance import t_test_p

    d = x - y
    mean, ci = float(d.mean()), float(1.96 * d.std() / np.sqrt(len(d)))
    verdict = "level (CI includes 0)" if abs(mean) <= ci else ("better" if mean > 0 else "worse")
    return {"mean": mean, "ci95": ci, "p_t": t_test_p(len(d), mean, float(d.std(ddof=1))),
            "users": len(d), "verdict": verdict}


def write(results: dict, checks: dict, diff: dict, args, configs: dict) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/quality_ml100k.py " + " ".join(sys.argv[1:])
    machine = f"{platform.node()}, {os.cpu_count()} cores"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out.with_suffix(".json").write_text(json.dumps(
        {"command": command, "machine": machine, "date": time.strftime("%Y-%m-%d"),
         "commit": commit, "defaults": configs, "workers": args.workers, "results": results,
         "paired_ndcg_nce_minus_autorec": diff, "checks": checks}, indent=2))
    lines = ["# ml-100k: NCE-AutoRec vs AutoRec (validation, default hyperparameters)\n",
             f"Command: `{command}`  ", f"Machine: {machine}; {time.strftime('%Y-%m-%d')}; "
             f"commit {commit}; {args.workers} Ray Train workers; one training seed each.  ",
             "Each model's defaults, as the run resolved them: "
             + "; ".join(f"{m}: {c}" for m, c in configs.items()) + ".\n",
             "| model | NDCG (95% CI) | Recall@50 | best epoch | median pop. | mean pop. | top-10% share | "
             "coverage |", "|---|---|---|---|---|---|---|---|"]
    for m, r in results.items():
        lines.append(f"| {m} | {r['best_valid_ndcg']:.4f} ± {r['ndcg_ci95']:.4f} | "
                     f"{r['best_valid_recall_at_50']:.4f} | "
                     f"{r['best_epoch']} | {r['median_popularity']:.0f} | "
                     f"{r['mean_popularity']:.1f} | {r['share_top10pct']:.3f} | "
                     f"{r['coverage']:.3f} |")
    lines.append(f"\nPaired per-user difference of validation NDCG, NCE-AutoRec − AutoRec "
                 f"({diff['users']} users): {diff['mean']:+.4f} ± {diff['ci95']:.4f} "
                 f"(paired t-test p = {diff['p_t']:.2g}): **{diff['verdict']}**.  ")
    lines.append("NCE-AutoRec's median recommended popularity below AutoRec's: "
                 + ("yes" if checks["nce_median_popularity_below_autorec"] else "no") + ".")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
