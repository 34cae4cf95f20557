"""The pipeline at 10x the Yahoo! Music users, projected from runs measured at several scales.

    .venv/bin/python benchmarks/projection.py [--fractions 0.25,0.5] [--factor 10] [--work DIR]

At 10x (18.8M users, 488M positives) the ETL's intermediate tables and the prepared rows need
more disk than this machine has (about 21 GiB of rows alone, plus Spark's spill), so the 10x
answer is a projection, measured: ``benchmarks/yahoo_scale.py`` runs the four stages at each
``--fractions`` of the Yahoo scale (one training epoch, 10% validation sampling), and the
committed full-scale run (``benchmarks/results/yahoo_scale.json``) is the last point. Per stage,
a least-squares line ``seconds = fixed + per_positive * positives`` through the points (its
largest relative residual says how straight the line is) gives:

- the stage's time at ``--factor`` times the Yahoo scale on this machine;
- the nodes like this one a cluster needs for that stage to take no longer than the full Yahoo
  scale takes here (weak scaling), and for the whole pipeline (3 epochs) to take 15 minutes,
  assuming the per-positive part divides over the nodes and the fixed part does not (Spark's
  stages are per-partition; training is data-parallel, its all-reduce of the model's gradients
  is per step, not per user, and not counted: a lower bound for training);
- the disk of the prepared rows and the recommendation lists, per positive, times the factor.

Memory is not extrapolated: each stage's measured peak is shown per scale. Spark holds its
tables with ``MEMORY_AND_DISK`` in a heap fixed by ``--driver-memory``, so more data spills
rather than growing the heap; the Python workers' share grows with a partition (at most 400
partitions, so about 1.2M positives each at 10x, 2.5x of the full scale's).
Results: ``benchmarks/results/projection.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report, yahoo_scale  # noqa: E402
from benchmarks.yahoo_scale import YAHOO  # noqa: E402

FULL = ROOT / "benchmarks" / "results" / "yahoo_scale.json"
STAGES = ("etl", "epoch", "score", "evaluate")
GIB = 2**30
PIPELINE_TARGET_S = 15 * 60
EPOCHS = 3


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def point(run: dict, fraction: float, work: Path | None) -> dict:
    """One scale's measurements: seconds per stage (the training stage as its mean whole
    epoch, validation and checkpoint included, and the rest of it as start-up), peaks, disk."""
    st = run["stages"]
    epochs = st["train"]["epochs"]
    epoch = float(np.mean([e["epoch_seconds"] for e in epochs]))
    out = {"fraction": fraction, "positives": round(YAHOO["positives"] * fraction),
           "users": round(YAHOO["users"] * fraction), "commit": run.get("commit"),
           "date": run.get("date"),
           "seconds": {"etl": st["etl"]["wall_s"], "epoch": round(epoch, 1),
                       "train_startup": round(st["train"]["wall_s"] - epoch * len(epochs), 1),
                       "score": st["score"]["wall_s"], "evaluate": st["evaluate"]["wall_s"]},
           "peak_over_start_gib": {k: st[k]["peak_over_start_gib"] for k in yahoo_scale.STAGES}}
    if work is not None:
        out["disk_bytes"] = {"rows": dir_bytes(work / "data"), "recs": dir_bytes(work / "recs")}
    return out


def fit(xs: list[float], ys: list[float]) -> dict:
    """Least-squares ``y = fixed + slope * x``, and the largest residual relative to its y."""
    slope, fixed = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    resid = max(abs(fixed + slope * x - y) / y for x, y in zip(xs, ys))
    return {"fixed": float(fixed), "slope": float(slope), "max_rel_residual": float(resid)}


def nodes_for(work_s: float, spare_s: float) -> int | None:
    """Nodes that do ``work_s`` of divisible work in ``spare_s``; None when no time is spare.
    (The 1e-6 keeps a fit's rounding from asking for one more node than an exact answer.)"""
    return math.ceil(work_s / spare_s - 1e-6) if spare_s > 0 else None


def project(points: list[dict], factor: float) -> dict:
    n10 = YAHOO["positives"] * factor
    stages = {}
    for s in STAGES:
        f = fit([p["positives"] for p in points], [p["seconds"][s] for p in points])
        full = next(p["seconds"][s] for p in points if p["fraction"] == 1.0)
        variable = f["slope"] * n10
        # nodes for the stage at 10x to take no longer than the full scale does on one node
        spare = full - max(f["fixed"], 0.0)
        nodes = nodes_for(variable, spare)
        stages[s] = {**f, "seconds_full": full, "seconds_projected": f["fixed"] + variable,
                     "nodes_for_full_scale_time": nodes}
    startup = float(np.mean([p["seconds"]["train_startup"] for p in points]))
    count = {"etl": 1, "epoch": EPOCHS, "score": 1, "evaluate": 1}
    fixed = startup + sum(max(stages[s]["fixed"], 0.0) * count[s] for s in STAGES)
    variable = sum(stages[s]["slope"] * n10 * count[s] for s in STAGES)
    one_node = fixed + variable
    nodes = nodes_for(variable, PIPELINE_TARGET_S - fixed)
    disk = {}
    for key in ("rows", "recs"):
        pts = [p for p in points if p.get("disk_bytes", {}).get(key)]
        if pts:
            per = float(np.mean([p["disk_bytes"][key] / p["positives"] for p in pts]))
            disk[key] = {"bytes_per_positive": per, "gib_projected": per * n10 / GIB}
    return {"factor": factor, "positives": n10, "users": YAHOO["users"] * factor,
            "stages": stages, "train_startup_s": startup,
            "pipeline": {"epochs": EPOCHS, "one_node_s": one_node, "fixed_s": fixed,
                         "nodes_for_15_min": nodes}, "disk": disk}


def markdown(stamp: dict, points: list[dict], proj: dict) -> list[str]:
    f = proj["factor"]
    lines = ["# The pipeline at 10x the Yahoo users: a projection from measured scales", "",
             f"Command: `{stamp['command']}`  ",
             f"Machine: {stamp['machine']}; {stamp['date']}; commit {stamp['commit']}.  ",
             "Points: `benchmarks/yahoo_scale.py --scale F --epochs 1 --valid-sample 0.1` at each "
             "fraction F below, in this run, and the committed full-scale run "
             f"(`yahoo_scale.json`, 3 epochs, {points[-1]['date']}, commit "
             f"{points[-1]['commit']}). Per stage a least-squares line seconds = fixed + "
             "per-positive x positives (benchmarks/projection.py says what it assumes).", "",
             "Measured (seconds; epoch: a whole training epoch, validation of 10% and the "
             "checkpoint included; peak GiB over the stage's start):", "",
             "| scale | users | positives | ETL s | epoch s | score s | evaluate s | train start-up s "
             "| peak GiB etl / train / score / evaluate |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        s, m = p["seconds"], p["peak_over_start_gib"]
        lines.append(f"| {p['fraction']:g} | {p['users']:,} | {p['positives']:,} | {s['etl']:.0f} "
                     f"| {s['epoch']:.0f} | {s['score']:.0f} | {s['evaluate']:.0f} | "
                     f"{s['train_startup']:.0f} | {m['etl']} / {m['train']} / {m['score']} / "
                     f"{m['evaluate']} |")
    lines += ["", f"Projected at {f:g}x ({proj['users']:,.0f} users, {proj['positives']:,.0f} "
              "positives):", "",
              "| stage | fixed s | µs per positive | largest residual | full scale s | "
              f"{f:g}x on this machine | nodes for {f:g}x in the full scale's time |",
              "|---|---|---|---|---|---|---|"]
    for s, r in proj["stages"].items():
        lines.append(f"| {s} | {r['fixed']:.0f} | {r['slope'] * 1e6:.2f} | "
                     f"{r['max_rel_residual']:.1%} | {r['seconds_full']:.0f} | "
                     f"{r['seconds_projected'] / 60:.1f} min | {r['nodes_for_full_scale_time']} |")
    pl = proj["pipeline"]
    lines += ["", f"Whole pipeline at {f:g}x with {pl['epochs']} epochs on this machine: "
              f"**{pl['one_node_s'] / 60:.0f} min** (of which {pl['fixed_s'] / 60:.1f} min does "
              f"not shrink with nodes); 15 min needs **{pl['nodes_for_15_min']} nodes** like this "
              "one (2 cores each), a lower bound: it assumes the per-positive work divides "
              "evenly and counts no all-reduce or shuffle over the network."]
    if proj["disk"]:
        lines += ["", f"Disk at {f:g}x: " + "; ".join(
            f"{k} {v['gib_projected']:.1f} GiB ({v['bytes_per_positive']:.1f} bytes a positive)"
            for k, v in proj["disk"].items()) + ", before Spark's shuffle files and spill."]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--fractions", default="0.25,0.5",
                   help="fractions of the Yahoo scale to measure (the full scale is the "
                        "committed yahoo_scale.json)")
    p.add_argument("--factor", type=float, default=10.0, help="the scale to project to")
    p.add_argument("--work", default=None, help="outputs of the runs (default: a new /tmp folder)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "projection"))
    a = p.parse_args(argv)
    stamp = report.stamp("projection.py", argv)
    full = json.loads(FULL.read_text())
    if "train" not in full["stages"] or "epochs" not in full["stages"]["train"]:
        raise SystemExit(f"{FULL} has no training epochs: run benchmarks/yahoo_scale.py first")
    work = Path(a.work or tempfile.mkdtemp(prefix="projection-")).resolve()
    points = []
    for frac in sorted(float(x) for x in a.fractions.split(",")):
        w = work / f"scale-{frac:g}"
        cmd = [sys.executable, "benchmarks/yahoo_scale.py", "--scale", f"{frac:g}", "--epochs", "1",
               "--valid-sample", "0.1", "--work", str(w), "--out", str(w / "yahoo_scale")]
        print("==", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=ROOT, check=True)
        points.append(point(json.loads((w / "yahoo_scale.json").read_text()), frac, w))
    points.append(point(full, 1.0, None))
    proj = project(points, a.factor)
    lines = markdown(stamp, points, proj)
    report.publish(Path(a.out), {**stamp, "points": points, "projection": proj}, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
