"""The README's main job: the whole pipeline on the shipped ml-latest-small.

Today it runs the ETL through its real entry point (``spark-submit etl/prepare.py``), then trains
NCE-AutoRec through ``training/train.py`` (Ray Train, 2 workers, tracked in MLflow); scoring and
evaluation join as they land. A second run reuses a prepared directory whose manifest matches the
input and parameters, and a finished training run of the same name; ``--redo`` does both again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from infra.submit import spark_submit

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "data" / "ml-latest-small" / "ratings.csv"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepared_is_current(out: Path, seed: int) -> bool:
    manifest = out / "manifest.json"
    if not manifest.exists():
        return False
    m = json.loads(manifest.read_text())
    return (m.get("inputs", [{}])[0].get("sha256") == sha256(DATASET)
            and m["parameters"]["seed"] == seed)


def run_spark(script: str, *args: str) -> None:
    """Run one of the project's Spark entry points as a user would, with this interpreter."""
    cmd, env = spark_submit(script, *args)
    print("$ spark-submit " + " ".join([script, *args]), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def run_training(prepared: Path, var: Path, model: str, seed: int, redo: bool) -> dict:
    """``python training/train.py`` as a user runs it; returns its summary line."""
    name = f"demo-{model}-seed{seed}"
    runs = var / "runs"
    if redo and (runs / name).exists():
        shutil.rmtree(runs / name)
    cmd = [sys.executable, "training/train.py", "--data", str(prepared), "--model", model,
           "--seed", str(seed), "--run-name", name, "--output", str(runs)]
    print("$ python " + " ".join(cmd[1:]), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    summary = None
    for line in proc.stdout:  # pass the progress through as it comes
        if line.startswith("SUMMARY "):
            summary = json.loads(line[len("SUMMARY "):])
        else:
            print("   " + line, end="", flush=True)
    if proc.wait() != 0 or summary is None:
        raise SystemExit(f"training {model} failed (exit {proc.returncode}); see the lines above")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--var", default=str(ROOT / "var"), help="where runs write (default ./var)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redo", action="store_true", help="redo every step even if its output exists")
    args = p.parse_args(argv)
    var = Path(args.var).resolve()
    prepared = var / "data" / "ml-latest-small"
    t0 = time.perf_counter()

    print("== 1/2 ETL: ml-latest-small -> " + str(prepared), flush=True)
    if not args.redo and prepared_is_current(prepared, args.seed):
        print("   already prepared (same input and seed); --redo to prepare again")
    else:
        run_spark("etl/prepare.py", "--dataset", "ml-latest-small", "--input", str(DATASET),
                     "--output", str(prepared), "--seed", str(args.seed), "--overwrite")

    m = json.loads((prepared / "manifest.json").read_text())
    c = m["counts"]
    print(f"\nPrepared {prepared}")
    print(f"  users {c['users']:,} ({c['cold_users']:,} cold-start), items {c['items']:,}")
    print("  positives " + ", ".join(f"{k} {v:,}" for k, v in c["positives"].items()))
    print(f"  user rows: {m['layout']['shards']} Parquet shards in {prepared / m['layout']['rows']}")

    print("\n== 2/2 training NCE-AutoRec on Ray Train", flush=True)
    s = run_training(prepared, var, "nce-autorec", args.seed, args.redo)
    print(f"\nNCE-AutoRec: best epoch {s['best_epoch']} of {s['epochs_run']}, validation NDCG "
          f"{s['best_valid_ndcg']:.4f}, Recall@50 {s['best_valid_recall_at_50']:.4f}")
    print(f"  model {s['model_path']}\n  MLflow {s['mlflow_uri']} (run {s['mlflow_run_id']}); "
          f"browse with: .venv/bin/mlflow ui --backend-store-uri {s['mlflow_uri']}")
    print(f"done in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
