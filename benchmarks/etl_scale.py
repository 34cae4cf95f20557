"""ETL scale benchmark: synthetic data at 1M, 10M and the Yahoo scale (49M positives).

    .venv/bin/python benchmarks/etl_scale.py                 # all three scales
    .venv/bin/python benchmarks/etl_scale.py --scales 1M     # one

Each scale runs ``spark-submit etl/prepare.py --dataset synthetic`` (the real entry point) with the
Yahoo R1 shape scaled by users: 44.9k items, 26 positives per user on average. Reported per scale:
wall time of the whole command, time and rows/s of each ETL step (from the manifest), and the peak
resident memory of the Spark driver JVM (local mode: it runs the executors too) and of the whole
process tree (JVM + Python workers), sampled every 0.2 s from /proc.

Results go to ``benchmarks/results/etl_scale.json`` and ``.md`` (each written whole, then renamed)
with the machine, command and commit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import floors as roofline  # noqa: E402
from benchmarks import report  # noqa: E402
from infra.submit import spark_submit  # noqa: E402

YAHOO = {"users": 1_876_280, "items": 44_865, "positives": 48_817_561}
SCALES = {"1M": 1_000_000, "10M": 10_000_000, "49M": YAHOO["positives"]}


def tree_rss(pid: int) -> tuple[int, int]:
    """(RSS of the JVM in the tree, RSS of the whole tree) in bytes."""
    procs = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            ppid, rss_pages = int(parts[1]), int(parts[21])
            with open(f"/proc/{p}/comm") as f:
                comm = f.read().strip()
            procs[int(p)] = (ppid, rss_pages * os.sysconf("SC_PAGE_SIZE"), comm)
        except (OSError, IndexError, ValueError):
            continue
    tree, frontier = set(), {pid}
    while frontier:
        tree |= frontier
        frontier = {p for p, (pp, _, _) in procs.items() if pp in frontier} - tree
    jvm = sum(procs[p][1] for p in tree if p in procs and procs[p][2] == "java")
    return jvm, sum(procs[p][1] for p in tree if p in procs)


def run_scale(name: str, positives: int, negatives: int, driver_memory: str, work: Path) -> dict:
    users = max(1, round(YAHOO["users"] * positives / YAHOO["positives"]))
    out = work / f"syn-{name}"
    shape = ["--users", str(users), "--items", str(YAHOO["items"]), "--positives", str(positives)]
    cmd, env = spark_submit("etl/prepare.py", "--dataset", "synthetic", *shape,
                            "--negatives", str(negatives), "--output", str(out), "--overwrite",
                            driver_memory=driver_memory)
    print(f"== {name}: {users:,} users, {positives:,} positives", flush=True)
    peak = [0, 0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            jvm, total = tree_rss(proc.pid)
            peak[0], peak[1] = max(peak[0], jvm), max(peak[1], total)
            stop.wait(0.2)

    threading.Thread(target=sample, daemon=True).start()
    rc = proc.wait()
    stop.set()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{name}: prepare.py failed with exit code {rc}")
    m = json.loads((out / "manifest.json").read_text())
    total_pos = sum(m["counts"]["positives"].values())
    du = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    shutil.rmtree(out)
    # the reference, same data and settings: generate, one shuffle by user, one Parquet write
    floor_cmd, _ = spark_submit("benchmarks/etl_floor.py", *shape,
                                "--output", str(work / f"floor-{name}"), driver_memory=driver_memory)
    t1 = time.perf_counter()
    subprocess.run(floor_cmd, env=env, cwd=ROOT, check=True, capture_output=True)
    floor = time.perf_counter() - t1
    shutil.rmtree(work / f"floor-{name}", ignore_errors=True)
    steps = [{**s, "rows_per_s": round(total_pos / s["seconds"]) if s["seconds"] else None}
             for s in m["steps"]]
    # the roofline at these counts (benchmarks/floors.py: read, shuffle, write at the rates
    # measured by benchmarks/results/floors.json), beside the Spark reference above
    roof = roofline.measured_floor("etl", dataclasses.replace(
        roofline.SHAPES["yahoo"], users=m["counts"]["users"], items=m["counts"]["items"],
        positives=total_pos, negatives_per_user=negatives))
    return {"scale": name, "users": m["counts"]["users"], "items": m["counts"]["items"],
            "positives": total_pos, "negatives_per_user": negatives, "wall_s": round(wall, 1),
            "floor_wall_s": round(floor, 1), "ratio_to_floor": round(wall / floor, 2),
            "roofline_s": roof and round(roof, 1), "ratio_to_roofline": roof and round(wall / roof, 2),
            "etl_s": m["seconds"], "positives_per_s": round(total_pos / wall),
            "driver_jvm_peak_gib": round(peak[0] / 2**30, 2),
            "process_tree_peak_gib": round(peak[1] / 2**30, 2), "output_gib": round(du / 2**30, 2),
            "shards": m["layout"]["shards"], "steps": steps}


def machine() -> dict:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import pyspark
    return {"cpus": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "spark": pyspark.__version__}


def to_markdown(res: dict) -> str:
    lines = ["# ETL scale benchmark", "", f"Command: `{res['command']}`  ",
             f"Commit: {res.get('commit', '?')}; date: {res['date']}  ",
             f"Machine: {res['machine']}", "",
             "Reference (floor): the same data generated, shuffled once by user and written as Parquet "
             "(`benchmarks/etl_floor.py`), run right after each ETL with the same settings. "
             "Roofline: the least time for the same reads, shuffle and writes at this machine's "
             "measured rates (`benchmarks/floors.py`, benchmarks/results/floors.md).", "",
             "| scale | users | items | positives | ETL wall s | floor wall s | ETL / floor "
             "| roofline s | ETL / roofline "
             "| positives/s | driver JVM peak GiB | process tree peak GiB | output GiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        lines.append(f"| {r['scale']} | {r['users']:,} | {r['items']:,} | {r['positives']:,} | "
                     f"{r['wall_s']} | {r['floor_wall_s']} | {r['ratio_to_floor']} | "
                     f"{r.get('roofline_s') or 'n/a'} | {r.get('ratio_to_roofline') or 'n/a'} | "
                     f"{r['positives_per_s']:,} | {r['driver_jvm_peak_gib']} | "
                     f"{r['process_tree_peak_gib']} | {r['output_gib']} |")
    lines += ["", "Seconds per step (rows/s = positives / step time):", "",
              "| scale | " + " | ".join(s["step"] for s in res["runs"][0]["steps"]) + " |",
              "|---|" + "---|" * len(res["runs"][0]["steps"])]
    for r in res["runs"]:
        lines.append(f"| {r['scale']} | " + " | ".join(f"{s['seconds']}" for s in r["steps"]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scales", nargs="+", default=list(SCALES), choices=list(SCALES))
    p.add_argument("--negatives", type=int, default=500, help="per user (the ETL's default)")
    p.add_argument("--driver-memory", default="8g")
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="etl-bench-"))
    runs = [run_scale(s, SCALES[s], args.negatives, args.driver_memory, work) for s in args.scales]
    res = {"command": "python benchmarks/etl_scale.py " + " ".join(sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "commit": report.commit(),
           "machine": machine(), "runs": runs}
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    text = to_markdown(res)
    report.publish(out / "etl_scale", res, text.rstrip("\n").split("\n"))
    print(text)


if __name__ == "__main__":
    main()
