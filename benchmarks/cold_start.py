"""The cold-start study: every model of the comparison table on users it never saw in training.

    .venv/bin/python benchmarks/cold_start.py [--datasets ml-100k,ml-latest-small,citeulike-a]
                                              [--models nce-autorec,bpr,...] [--prepared DIR]

Protocol (protocol.md): the ETL holds a seeded 5% of users out of training (``cold``); a model
serves them from their train part alone (the AutoRec family and the closed-form models by their
input row, BPR, CML and CDAE by folding in a user vector with the item parameters frozen), and their
truth is their valid+test parts. Each model runs at the configuration the comparison table chose on
validation (``benchmarks/results/baselines.json``), retrained on train+valid for the chosen epoch
count, as that table's test row; then the real scoring and evaluation code does the rest:
``evaluation/score.py``'s ``score`` writes the top 50 of every user (warm: train+valid excluded;
cold: train excluded), ``evaluation/evaluate.py``'s ``evaluate`` computes NDCG with 95% CIs for
both groups, the per-user cold-start scatter (every model against NCE-AutoRec) and the popularity
of the lists. One local Spark session serves every dataset.

The warm users' test NDCG here is the comparison table's, now through Spark scoring: a check that
the two paths agree (exactly for the closed-form models; the gradient models are retrained, same
seed, same data, same order).

Results: ``benchmarks/results/cold_start.{json,md}`` (a run replaces the datasets it runs and keeps
the others, each stamped with its command and commit) and, per dataset,
``benchmarks/results/cold_start/DATASET-{ndcg,scatter}.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.baselines import DATASETS, fit, prepare  # noqa: E402
from infra.demo import commit  # noqa: E402
from models.registry import save  # noqa: E402
from prepared import schema as S  # noqa: E402
from prepared.reader import open_prepared  # noqa: E402
from runtime.runs import MODEL_FILE  # noqa: E402
from training.closed_form import read_rows  # noqa: E402
from training.config import TrainConfig  # noqa: E402

TABLE = ROOT / "benchmarks" / "results" / "baselines.json"
REFERENCE = "nce-autorec"  # the paper's model: the x axis of every scatter panel


def chosen(dataset: str, models: list[str] | None) -> dict[str, dict]:
    """model -> the comparison table's choice (hyperparameters, epochs) on ``dataset``, the paper's
    model first."""
    rows = json.loads(TABLE.read_text())["results"].get(dataset, {}).get("models", {})
    if not rows:
        raise SystemExit(f"{TABLE} has no rows for {dataset}: run benchmarks/baselines.py "
                         f"--datasets {dataset} first")
    unknown = sorted(set(models or ()) - set(rows))
    if unknown:
        raise SystemExit(f"--models: {', '.join(unknown)} not in the table for {dataset}; it has "
                         f"{', '.join(rows)}")
    names = sorted(models or rows, key=lambda m: (m != REFERENCE, m))
    return {m: rows[m]["best"] for m in names}


def train_and_save(prepared: Path, model: str, best: dict, out: Path, cache: dict) -> float:
    """The table's final model (train+valid, chosen epochs) written as a run's ``model.pt``."""
    prep = open_prepared(str(prepared))
    if "rows" not in cache:
        from benchmarks.tune_defaults import load

        cache["rows"] = read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS, S.TEST_ITEMS])
        cache["table"] = load(str(prepared))[1]
    cfg = TrainConfig(data=str(prepared), model=model, train_splits="train,valid",
                      epochs=best["epochs"], **best["hp"])
    net, seconds, _, _ = fit(prep, cfg, cache["rows"], cache["table"], None)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(save(net, config={"train_splits": "train,valid", "run_name": model}),
               out / MODEL_FILE)
    return seconds


def ndcg_figure(dataset: str, models: list[str], by: dict, users: dict):
    """Warm (test) and cold-start NDCG with 95% CIs, one row per model, best cold first."""
    from evaluation.plots import _plt

    plt = _plt()
    order = sorted(models, key=lambda m: by[m, "cold"]["mean"])
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(order) + 1.6))
    for dy, group, color in ((-0.15, "warm", "tab:blue"), (0.15, "cold", "tab:orange")):
        ax.errorbar([by[m, group]["mean"] for m in order], [i + dy for i in range(len(order))],
                    xerr=[by[m, group]["ci95"] for m in order], fmt="o", color=color, capsize=3,
                    label=f"{group} users ({users[group]:,}; truth: "
                          f"{'test' if group == 'warm' else 'valid+test'})")
    ax.set_yticks(range(len(order)), order)
    ax.set(xlabel="NDCG (top 50), 95% CI", title=f"{dataset}: users seen in training vs cold-start")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    return fig


def run_dataset(spark, name: str, prepared: Path, models: dict, work: Path, figures: Path) -> dict:
    from evaluation.evaluate import evaluate
    from evaluation.plots import png_bytes
    from evaluation.score import score

    recs, fit_seconds, cache = [], {}, {}
    for model, best in models.items():
        t0 = time.perf_counter()
        fit_seconds[model] = train_and_save(prepared, model, best, work / "runs" / model, cache)
        out = work / "recs" / model
        score(spark, model=str(work / "runs" / model / MODEL_FILE), data=str(prepared),
              output=str(out), overwrite=True)
        recs.append(out)
        print(f"{name} {model} {best['hp']}: trained and scored in "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
    evaluation = work / "eval"
    m = evaluate(spark, recs=[str(r) for r in recs], labels=list(models), data=str(prepared),
                 output=str(evaluation), no_mlflow=True, overwrite=True)
    by = {(r["label"], r["group"]): r for r in m["rows"] if r["metric"] == "NDCG"}
    users = {g: next(r["users"] for (_, gg), r in by.items() if gg == g) for g in ("warm", "cold")}
    figures.mkdir(parents=True, exist_ok=True)
    (figures / f"{name}-ndcg.png").write_bytes(png_bytes(ndcg_figure(name, list(models), by, users)))
    shutil.copyfile(evaluation / "cold_start.png", figures / f"{name}-scatter.png")
    from evaluation.evaluate import report

    return {"users": users, "report": report(m, "EVAL").split("\nplots:")[0],
            "models": {mm: {"hp": models[mm]["hp"], "epochs": models[mm]["epochs"],
                            "fit_seconds": round(fit_seconds[mm], 1),
                            **{g: {"ndcg": by[mm, g]["mean"], "ci95": by[mm, g]["ci95"]}
                               for g in ("warm", "cold")},
                            "median_popularity": m["popularity"][mm]["median_popularity"]}
                       for mm in models}}


def previous(out: Path) -> dict:
    """The committed results by dataset, each stamped with the run that produced it."""
    path = out.with_suffix(".json")
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    stamp = {k: old[k] for k in ("command", "machine", "date", "commit") if k in old}
    return {name: {"stamp": stamp, **r} if "stamp" not in r else r
            for name, r in old["results"].items()}


def write(results: dict, out: Path) -> None:
    """Every dataset's results (JSON and Markdown, replaced atomically), each under the command,
    machine, date and commit that produced it."""
    md = ["# Cold-start study: every model on users held out of training\n",
          "Each model at the configuration `baselines.md` chose on validation, retrained on "
          "train+valid; scored by `evaluation/score.py` (cold-start users: their train part as "
          "input, a fold-in for BPR, CML and CDAE), evaluated by `evaluation/evaluate.py`. Warm "
          "users: truth test, train+valid excluded; cold-start users: truth valid+test, train "
          "excluded. Ratio: cold NDCG / warm NDCG (they differ in truth size, so compare models "
          "within a column, not the columns).\n"]
    for name, r in results.items():
        st = r["stamp"]
        md += [f"## {name} ({r['users']['warm']:,} warm users with a test item, "
               f"{r['users']['cold']:,} cold-start users)\n",
               f"`{st['command']}` on {st['machine']}, {st['date']}, commit {st['commit']}.\n",
               f"![NDCG of warm and cold-start users](cold_start/{name}-ndcg.png)\n",
               "| model | warm NDCG (95% CI) | cold-start NDCG (95% CI) | ratio | median popularity "
               "| fit s |", "|---|---|---|---|---|---|"]
        for m, v in sorted(r["models"].items(), key=lambda kv: -kv[1]["cold"]["ndcg"]):
            md.append(f"| {m} | {v['warm']['ndcg']:.4f} ± {v['warm']['ci95']:.4f} | "
                      f"{v['cold']['ndcg']:.4f} ± {v['cold']['ci95']:.4f} | "
                      f"{v['cold']['ndcg'] / max(v['warm']['ndcg'], 1e-12):.2f} | "
                      f"{v['median_popularity']:.0f} | {v['fit_seconds']:.1f} |")
        md += ["", f"Per-user cold-start NDCG, each model against {next(iter(r['models']))}: "
               f"![scatter](cold_start/{name}-scatter.png)\n",
               "<details><summary>every metric (evaluate.py's report)</summary>\n", "```",
               r["report"], "```", "</details>\n"]
    report.publish(out, {"results": results}, md)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--models", default=None,
                   help="comma-separated (default: every model the comparison table has)")
    p.add_argument("--prepared", default=None,
                   help="a folder of already prepared datasets (DIR/NAME, the ETL's defaults); "
                        "those missing are prepared into it")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cold_start"))
    args = p.parse_args(argv)
    names = args.datasets.split(",")
    unknown = sorted(set(names) - set(DATASETS))
    if unknown:
        p.error(f"--datasets: unknown {', '.join(unknown)}; known: {', '.join(DATASETS)}")
    picked = {n: chosen(n, args.models.split(",") if args.models else None) for n in names}
    torch.set_num_threads(os.cpu_count() or 1)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cold-start-", dir=ROOT / "var"))
    prepared_root = Path(args.prepared) if args.prepared else work / "data"
    os.environ.setdefault("SPARK_MASTER", "local[2]")
    os.environ.setdefault("SPARK_DRIVER_MEMORY", "3g")
    from runtime.spark import get_spark

    spark = get_spark("cold-start-study", {"spark.sql.shuffle.partitions": "8"})
    stamp = {"command": "python benchmarks/cold_start.py " + " ".join(
                 sys.argv[1:] if argv is None else argv),
             "machine": f"{platform.node()}, {os.cpu_count()} cores",
             "date": time.strftime("%Y-%m-%d"), "commit": commit()}
    out = Path(args.out)
    results = previous(out)  # the datasets not run now keep their committed results
    for name in names:
        prepared = prepared_root / name
        if not (prepared / "manifest.json").exists():
            prepared = prepare(name, Path(args.shared), prepared_root)
        results[name] = {"stamp": stamp, **run_dataset(spark, name, prepared, picked[name],
                                                       work / name, out.parent / out.name)}
        write(results, out)  # after each dataset: a long run that stops keeps what it did
    spark.stop()
    print(f"results: {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
