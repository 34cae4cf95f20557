"""The whole pipeline at the paper's Yahoo! Music scale on this machine, through the real entry
points, with each stage's wall time and peak memory.

    .venv/bin/python benchmarks/yahoo_scale.py [--epochs 3] [--batch-size 8192] [--lr 3e-3]
                                               [--valid-sample 0.1] [--work DIR]
                                               [--stages etl,train,score,evaluate]

    1. spark-submit etl/prepare.py --dataset synthetic   1.88M users, 44.9k items, 49M positives
    2. python training/train.py --model nce-autorec      2 Ray Train workers x 1 thread, local Ray,
                                                         --epochs (no early stop), SQLite MLflow
    3. spark-submit evaluation/score.py                  top 50 of every user, train+valid excluded
    4. spark-submit evaluation/evaluate.py               test metrics with CIs, popularity, cold start

Memory is the machine's used memory (MemTotal - MemAvailable, /proc/meminfo) sampled every half
second: the stage's peak, and that peak less what was in use when the stage started (every
process of the stage together: the Spark JVM and its Python workers, the Ray head, object store
and workers). Outputs go to ``--work`` (default: a new folder under /tmp; several GiB), never to
the repository; ``--stages`` reruns some stages over a previous ``--work``. Results (merged per
stage with a previous run's): ``benchmarks/results/yahoo_scale.{json,md}``, with the CPU (model,
cores, the vector instructions torch uses: ``floors.cpu``) of the run and of each stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import floors, report  # noqa: E402
from infra.submit import spark_submit  # noqa: E402
from runtime.runs import summary_text  # noqa: E402

YAHOO = {"users": 1_876_280, "items": 44_865, "positives": 48_817_561}
STAGES = ("etl", "train", "score", "evaluate")
GIB = 2**30


def used_bytes() -> int:
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) * 1024
    return info["MemTotal"] - info["MemAvailable"]


ETL_STEP = re.compile(r"\[etl\] (\w+)\s+([\d.]+)s\s")  # etl/prepare.py's "[etl] dedup  57.0s  rows=.."
EVAL_PHASES = "evaluation phase seconds: "            # evaluation/evaluate.py's last log line


def stage_phases(line: str) -> dict[str, float]:
    """The seconds of a stage's steps that ``line`` reports (the ETL's steps, the evaluation's
    phases), so that the report shows where a stage's time goes beside its floor."""
    if EVAL_PHASES in line:
        return json.loads(line.split(EVAL_PHASES, 1)[1])
    m = ETL_STEP.search(line)
    return {m.group(1): float(m.group(2))} if m else {}


def run_stage(name: str, cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` with its output passed through; wall seconds and peak memory."""
    print(f"\n== {name}: {' '.join(cmd)}", flush=True)
    base = used_bytes()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.5):
            peak[0] = max(peak[0], used_bytes())

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    summary, phases = None, {}
    for line in proc.stdout:
        if summary_text(line) is not None:
            summary = json.loads(summary_text(line))
        phases.update(stage_phases(line))
        print("   " + line, end="", flush=True)
    rc = proc.wait()
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    if rc != 0:
        raise SystemExit(f"{name} failed (exit {rc}); see the lines above")
    out = {"stage": name, "date": time.strftime("%Y-%m-%d %H:%M"),
           "wall_s": round(wall, 1), "peak_used_gib": round(peak[0] / GIB, 2),
           "peak_over_start_gib": round((peak[0] - base) / GIB, 2), "cpu": floors.cpu()}
    if summary is not None:
        out["summary"] = summary
    if phases:
        out["phases"] = phases
    print(f"== {name}: {wall / 60:.1f} min, peak {out['peak_used_gib']} GiB used "
          f"(+{out['peak_over_start_gib']} GiB)", flush=True)
    return out


def epoch_times(mlflow_uri: str, summary: dict) -> list[dict]:
    """Per epoch from the run's MLflow history: the training pass, the whole epoch (validation
    and checkpoint included), users/s and validation NDCG."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_uri)
    history = {name: {m.step: m.value for m in client.get_metric_history(
        summary["mlflow_run_id"], name)} for name in
        ("train_seconds", "valid_seconds", "epoch_seconds", "users_per_second", "valid_ndcg",
         "valid_users")}
    return [{"epoch": e, **{name: round(h[e], 4) for name, h in history.items() if e in h}}
            for e in sorted(history["epoch_seconds"])]


def cpu_note(stage: dict, cpu: str) -> str:
    """'' for a stage run on ``cpu`` (this run's); a stage kept from an earlier run (``--stages``)
    on another CPU, or from before stages recorded theirs, says so beside its date."""
    return "" if stage.get("cpu") == cpu else f" (CPU: {stage.get('cpu', 'not recorded')})"


def floors_commit() -> str:
    """The commit benchmarks/results/floors.json was measured at ("none" before it exists)."""
    try:
        return floors.load().get("commit") or "unknown"
    except FileNotFoundError:
        return "none"


def main(argv: list[str] | None = None) -> int:
    """The benchmark's steps in the order they run and are reported: a script's main, read top
    to bottom, each measurement's setup beside it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--epochs", type=int, default=3, help="training epochs (all run)")
    p.add_argument("--batch-size", type=int, default=8192, help="users per step, all workers")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    p.add_argument("--valid-sample", type=float, default=1.0,
                   help="fraction of validation users scored each epoch (train.py --valid-sample)")
    p.add_argument("--work", default=None, help="where the outputs go (default: a new /tmp folder)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of "
                   + ",".join(STAGES))
    p.add_argument("--scale", type=float, default=1.0,
                   help="fraction of the Yahoo users and positives (a quick check of the script)")
    p.add_argument("--driver-memory", default="6g", help="Spark driver memory (local mode)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "yahoo_scale"))
    a = p.parse_args(argv)
    stages = a.stages.split(",")
    if unknown := set(stages) - set(STAGES):
        p.error(f"--stages: unknown {sorted(unknown)}; choose from {','.join(STAGES)}")
    work = Path(a.work or tempfile.mkdtemp(prefix="yahoo-scale-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data, runs, recs, ev = work / "data", work / "runs", work / "recs", work / "eval"
    mlflow_uri = f"sqlite:///{work / 'mlflow.db'}"
    # the CPU as floors.py records it: the host behind one name changes (AVX-512 or AVX2)
    stamp = {**report.stamp("yahoo_scale.py", argv), "cpu": floors.cpu()}
    users, positives = round(YAHOO["users"] * a.scale), round(YAHOO["positives"] * a.scale)
    print(f"work folder: {work}", flush=True)

    results = {}
    out = Path(a.out)
    if out.with_suffix(".json").exists() and a.stages != ",".join(STAGES):
        results = json.loads(out.with_suffix(".json").read_text()).get("stages", {})
    spark = lambda script, *args: spark_submit(script, *args, master="local[2]",
                                               driver_memory=a.driver_memory)
    if "etl" in stages:
        results["etl"] = run_stage("etl", *spark(
            "etl/prepare.py", "--dataset", "synthetic", "--users", str(users),
            "--items", str(YAHOO["items"]), "--positives", str(positives),
            "--output", str(data), "--overwrite"))
    if "train" in stages:
        shutil.rmtree(runs / "yahoo-nce", ignore_errors=True)  # a rerun trains again
        results["train"] = run_stage("train", [
            sys.executable, "training/train.py", "--data", str(data), "--model", "nce-autorec",
            "--epochs", str(a.epochs), "--patience", str(a.epochs), "--batch-size",
            str(a.batch_size), "--lr", str(a.lr), "--num-workers", "2", "--cpus-per-worker", "1",
            "--valid-sample", str(a.valid_sample),
            "--runs-dir", str(runs), "--run-name", "yahoo-nce", "--mlflow-uri", mlflow_uri])
        results["train"]["epochs"] = epoch_times(mlflow_uri, results["train"]["summary"])
    if "score" in stages:
        results["score"] = run_stage("score", *spark(
            "evaluation/score.py", "--model", str(runs / "yahoo-nce"), "--data", str(data),
            "--output", str(recs), "--k", "50", "--exclude", "train,valid", "--overwrite"))
    if "evaluate" in stages:
        results["evaluate"] = run_stage("evaluate", *spark(
            "evaluation/evaluate.py", "--recs", str(recs), "--labels", "NCE-AutoRec", "--data",
            str(data), "--output", str(ev), "--mlflow-uri", mlflow_uri, "--overwrite"))
        rows = json.loads((ev / "metrics.json").read_text())
        results["evaluate"]["metrics"] = [
            r for r in rows if r["metric"] in ("NDCG", "R-Precision", "Recall@50", "Precision@50")]

    total = sum(r["wall_s"] for r in results.values())
    # each stage's floor at this run's shape (benchmarks/floors.py's committed rates)
    shape = dataclasses.replace(floors.SHAPES["yahoo"], users=users, positives=positives,
                                global_batch=a.batch_size, valid_sample=a.valid_sample)
    floor = floors.pipeline_floors(shape, a.epochs) or {}
    floors_cpu = (floors.load().get("cpu") if floor else None)

    def ratio(name: str, seconds: float, stage: str) -> str:
        """The stage's seconds over its floor, where both were measured on one CPU."""
        if name not in floor:
            return "n/a (no floors.json)"
        if floors_cpu is None or results[stage].get("cpu") != floors_cpu:
            return "n/a (floors from another CPU)"
        return f"{seconds / floor[name]:.1f}x of {floor[name]:,.0f} s"

    lines = ["# The pipeline at the Yahoo! Music scale on this machine", "",
             f"Command: `{stamp['command']}`  ",
             f"Machine: {stamp['machine']}; CPU: {stamp['cpu']}; {stamp['date']}.  ",
             f"Synthetic data at {a.scale:g} of the paper's Yahoo scale ({users:,} users, "
             f"{YAHOO['items']:,} items, {positives:,} positives); NCE-AutoRec, width "
             f"200, {a.epochs} epochs, global batch {a.batch_size}, lr {a.lr}, 2 workers x 1 "
             f"thread, validation on {a.valid_sample:g} of the validation users each epoch; top "
             "50 of every user. Memory: the machine's used memory (MemTotal - "
             "MemAvailable) at its peak during the stage, and that peak less the use at the "
             "stage's start. Ratio to floor: the stage's wall time over the least time this "
             "machine needs for its work (benchmarks/floors.py, from rates measured by "
             f"benchmarks/results/floors.md, commit {floors_commit()}; the training stage's "
             "floor is its epochs' training passes and validation)."
             + ("" if floors.same_cpu() is not False else
                f" The floors were measured on another CPU ({floors_cpu}; this is "
                f"{floors.cpu()}): a stage has a ratio only where it ran on the floors' CPU; "
                "rerun benchmarks/floors.py on this one."), "",
             "| stage | wall | ratio to floor | peak used GiB | peak over start GiB | run at |",
             "|---|---|---|---|---|---|"]
    for name in STAGES:
        if name in results:
            r = results[name]
            lines.append(f"| {name} | {r['wall_s'] / 60:.1f} min | {ratio(name, r['wall_s'], name)} | "
                         f"{r['peak_used_gib']} | {r['peak_over_start_gib']} | "
                         f"{r.get('date', '')}{cpu_note(r, stamp['cpu'])} |")
    lines.append(f"| **total** | **{total / 60:.1f} min** | | | | |")
    timed = [name for name in STAGES if results.get(name, {}).get("phases")]
    if timed:
        lines += ["", "Where the ETL's and the evaluation's time goes (their own log lines: the "
                  "ETL's steps, the evaluation's phases, seconds; outside them: spark-submit's "
                  "JVM, the Spark session and Python's imports):", ""]
        for name in timed:
            r = results[name]
            steps = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
            outside = r["wall_s"] - sum(r["phases"].values())
            lines.append(f"- {name}: {steps}; outside them {outside:.1f} s of {r['wall_s']:.1f}")
    if "train" in results:
        lines += ["", "| epoch | training pass s | ratio to the epoch's floor | validation s "
                  "(users) | whole epoch s (checkpoint included) | users/s | valid NDCG |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {e['epoch']} | {e.get('train_seconds', 0):.0f} | "
                  f"{ratio('epoch', e.get('train_seconds', float('nan')), 'train')} | "
                  f"{e.get('valid_seconds', float('nan')):.0f} ({e.get('valid_users', 0):,.0f}) | "
                  f"{e['epoch_seconds']:.0f} | {e.get('users_per_second', 0):,.0f} | "
                  f"{e.get('valid_ndcg', float('nan')):.4f} |"
                  for e in results["train"].get("epochs", [])]
    if "evaluate" in results:
        lines += ["", "| group | metric | mean | 95% CI | users |", "|---|---|---|---|---|"]
        lines += [f"| {r.get('group')} | {r['metric']} | {r['mean']:.4f} | "
                  f"±{r.get('ci95', float('nan')):.4f} | {r.get('users', '')} |"
                  for r in results["evaluate"]["metrics"]]
    report.publish(out, {**stamp, "work": str(work), "stages": results, "floors_s": floor,
                         "floors_commit": floors_commit()}, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
