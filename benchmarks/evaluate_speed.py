"""Wall time of ``spark-submit evaluation/evaluate.py``, this tree's against a baseline commit's,
in the same run, on the same inputs, with their outputs compared number by number.

    .venv/bin/python benchmarks/evaluate_speed.py [--fraction 0.25] [--sizes yahoo,small,ml100k]
                                                  [--baseline main] [--work /tmp/evaluate-speed]

Two inputs, each prepared once and cached in ``--work`` (never in the repository):

- yahoo: ``etl/prepare.py --dataset synthetic`` at ``--fraction`` of the Yahoo! Music shape
  (users and positives scaled, 44,865 items), with top-50 lists for 2 models;
- small: the shipped ml-latest-small through the real ETL, with top-50 lists for 3 models (as the
  demo evaluates NCE-AutoRec, AutoRec and PureSVD);
- ml100k: ml-100k (``--shared``/ml-100k/u.data) through the real ETL, 3 lists as small's.

The lists are synthetic, in exactly the format and layout ``evaluation/score.py`` writes (one
Parquet file of user_id, item_ids, scores per rows shard, named as the shard, plus
``_manifest.json`` listing every file and the rows shards' CRC-32s; ``--plain-lists``: files of
consecutive users, as lists written by other code): for every user, 50 distinct items drawn by
training popularity with a fixed seed per model, so the metrics are small but not zero and the
lists lean to the head as a model's do. The baseline is the
``--baseline`` commit's tree (``git archive``), run as its own spark-submit beside this tree's,
each logging to MLflow (a SQLite store in ``--work``), as the demo does. Results:
``benchmarks/results/evaluate_speed.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from infra.submit import spark_submit  # noqa: E402

YAHOO = {"users": 1_876_280, "items": 44_865, "positives": 48_817_561}  # yahoo_scale.py's
K = 50
SHARDS = 8  # Parquet files per plain list (--plain-lists), as a writer's tasks write several
PHASE = re.compile(r"evaluation phase seconds: (\{.*\})")


def run(cmd: list[str], env: dict | None = None, log: Path | None = None,
        cwd: Path = ROOT) -> tuple[float, str]:
    """Run ``cmd``; (wall seconds, its output). Fails with the output's tail on a non-zero exit."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    wall = time.perf_counter() - t0
    if log is not None:
        log.write_text(p.stdout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} ... failed (exit {p.returncode}):\n"
                         + "\n".join(p.stdout.splitlines()[-30:]))
    return wall, p.stdout


def prepare(work: Path, name: str, args: list[str], driver_memory: str) -> Path:
    """The prepared dataset ``work/name/data``, made once by etl/prepare.py."""
    data = work / name / "data"
    if not (data / "manifest.json").exists():
        print(f"preparing {name}: etl/prepare.py {' '.join(args)}", flush=True)
        cmd, env = spark_submit("etl/prepare.py", *args, "--output", str(data), "--overwrite",
                                master="local[2]", driver_memory=driver_memory)
        wall, _ = run(cmd, env)
        print(f"   {wall:.0f} s", flush=True)
    return data


def distinct_draws(rng: np.random.Generator, cdf: np.ndarray, n: int, k: int) -> np.ndarray:
    """(n, k) item indices, distinct within each row: drawn by ``cdf`` (popularity), each repeat
    replaced by a uniform draw until none is left."""
    items = len(cdf)
    draws = np.searchsorted(cdf, rng.random((n, k)) * cdf[-1], side="right").clip(0, items - 1)
    rows = np.arange(n)[:, None]
    while True:
        order = np.argsort(draws, axis=1, kind="stable")
        s = draws[rows, order]
        dup = np.zeros_like(draws, bool)
        dup[rows, order[:, 1:]] = s[:, 1:] == s[:, :-1]
        if not dup.any():
            return draws
        draws[dup] = rng.integers(0, items, int(dup.sum()))


def write_lists(data: Path, out: Path, label: str, seed: int, sharded: bool = True) -> None:
    """Synthetic top-K lists for every user of ``data`` in score.py's format, once. ``sharded``:
    one file per rows shard, named as the shard and holding its users, with the manifest's
    ``row_shards``, exactly as score.py writes them (evaluate.py reads them beside the rows);
    else ``SHARDS`` files of consecutive users, as a file written elsewhere (the shuffle)."""
    marker = out / "_manifest.json"
    if marker.exists() and ("row_shards" in json.loads(marker.read_text())) == sharded:
        return
    prep = json.loads((data / "manifest.json").read_text())
    layout = prep["layout"]
    items = pq.read_table(data / layout["items"], columns=["item_index", "item_id",
                                                         "pop_train_valid"])
    order = np.argsort(items["item_index"].to_numpy())
    item_ids = np.asarray(items["item_id"].cast(pa.string()).to_numpy(zero_copy_only=False))[order]
    cdf = np.cumsum(items["pop_train_valid"].to_numpy()[order].astype(np.float64) + 1.0)
    if sharded:
        folder = layout["rows"].rstrip("/") + "/"
        shards = {f[len(folder):]: prep["crc32"][f] for f in sorted(prep["files"])
                  if f.startswith(folder) and not f[len(folder):].startswith(("_", "."))}
        chunks = [(name, pq.read_table(data / folder / name, columns=["user_id"])["user_id"])
                  for name in shards]
    else:
        users = pq.read_table(data / layout["users"], columns=["user_id"])["user_id"]
        bounds = np.linspace(0, len(users), SHARDS + 1).astype(int)
        chunks = [(f"part-{i:05d}.snappy.parquet", users.slice(int(lo), int(hi - lo)))
                  for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))]
    rng = np.random.default_rng(seed)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files, n_users = {}, 0
    for name, ids in chunks:
        user_ids = ids.cast(pa.string()).to_numpy(zero_copy_only=False)
        n = len(user_ids)
        n_users += n
        draws = distinct_draws(rng, cdf, n, K)
        offsets = pa.array(np.arange(0, n * K + 1, K, dtype=np.int32))
        scores = np.sort(rng.random((n, K)).astype(np.float32), axis=1)[:, ::-1]
        table = pa.table({
            "user_id": pa.array(user_ids, pa.string()),
            "item_ids": pa.ListArray.from_arrays(offsets, pa.array(item_ids[draws.ravel()],
                                                                   pa.string())),
            "scores": pa.ListArray.from_arrays(offsets, pa.array(scores.ravel(), pa.float32()))})
        pq.write_table(table, out / name, compression="snappy")
        files[name] = (out / name).stat().st_size
    manifest = {"kind": "recommendations", "model_name": label, "model_kind": "synthetic",
                "data": str(data), "dataset": prep["dataset"], "k": K, "users": "all",
                "scored_users": n_users, "files": files,
                "columns": {"user_id": "string", "item_ids": "list<string>",
                            "scores": "list<float>"},
                **({"row_shards": shards} if sharded else {})}
    marker.write_text(json.dumps(manifest, indent=2))


def baseline_tree(work: Path, ref: str) -> tuple[Path, str]:
    """The tree of commit ``ref`` under ``work`` (git archive), once per commit."""
    sha = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = work / f"base-{sha[:12]}"
    if not (tree / "evaluation" / "evaluate.py").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree, sha


def evaluate(tree: Path, data: Path, recs: list[Path], labels: list[str], out: Path,
             mlflow_uri: str, driver_memory: str) -> dict:
    """One spark-submit of ``tree``'s evaluation/evaluate.py: wall seconds and its phase times."""
    cmd, env = spark_submit(str(tree / "evaluation" / "evaluate.py"), "--recs",
                            *map(str, recs), "--labels", *labels, "--data", str(data),
                            "--output", str(out), "--mlflow-uri", mlflow_uri, "--overwrite",
                            master="local[2]", driver_memory=driver_memory)
    # Spark's Python workers import the project's modules by name, from PYTHONPATH and their
    # working directory, not from the driver's sys.path: both must be the timed tree, or the
    # baseline's driver runs this tree's worker functions (and the venv's editable install
    # would give both sides the checkout's).
    env = {**env, "PYTHONPATH": str(tree)}
    wall, text = run(cmd, env, log=out.parent / f"{out.name}.log", cwd=tree)
    phases = PHASE.findall(text)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": round(wall, 1), "evaluate_seconds": manifest["seconds"],
            **({"phases_s": json.loads(phases[-1])} if phases else {})}


def numbers(out: Path) -> dict[str, float]:
    """Every number of an evaluation's outputs by a stable key: metrics, paired, popularity."""
    m = json.loads((out / "manifest.json").read_text())
    flat = {}
    for r in m["rows"]:
        for f in ("mean", "ci95", "users"):
            flat[f"rows/{r['label']}/{r['group']}/{r['metric']}/{f}"] = r[f]
    for r in m["paired"]:
        for f in ("mean_difference", "ci95", "users", "reference_better", "reference_worse",
                  "t_p", "wilcoxon_p", "t_p_holm", "wilcoxon_p_holm"):
            flat[f"paired/{r['comparison']}/{r['reference']}/{r['label']}/{r['metric']}/{f}"] = r[f]
    for label, s in m["popularity"].items():
        for f, v in s.items():
            flat[f"popularity/{label}/{f}"] = v
    for label, groups in m.get("users_without_recommendations", {}).items():  # older code's
        for g, v in groups.items():
            flat[f"missing/{label}/{g}"] = v
    return flat


def compare(a: Path, b: Path) -> dict:
    """The largest difference between two evaluations' numbers, and the keys only one has."""
    x, y = numbers(a), numbers(b)
    diff = 0.0
    for k in set(x) & set(y):
        u, v = float(x[k]), float(y[k])
        if not (math.isnan(u) and math.isnan(v)):
            diff = max(diff, abs(u - v))
    same_files = sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    return {"max_abs_difference": diff, "only_baseline": sorted(set(x) - set(y)),
            "only_new": sorted(set(y) - set(x)), "same_files": same_files, "numbers": len(x)}


def main(argv: list[str] | None = None) -> int:
    """The benchmark's steps in the order they run and are reported: a script's main, read top
    to bottom, each measurement's setup beside it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--fraction", type=float, default=0.25,
                   help="fraction of the Yahoo users and positives (1: the full shape)")
    p.add_argument("--sizes", default="yahoo,small", help="comma-separated: yahoo, small, ml100k")
    p.add_argument("--lists", type=int, default=2, choices=[1, 2],
                   help="yahoo: lists evaluated together (1: the pipeline's case, "
                        "benchmarks/yahoo_scale.py; 2: an experiment's)")
    p.add_argument("--plain-lists", action="store_true",
                   help="write the lists as files of consecutive users (a file written "
                        "elsewhere: evaluate.py shuffles them by user) instead of one per rows "
                        "shard as score.py writes them")
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"),
                   help="the shared datasets (ml100k's input)")
    p.add_argument("--baseline", default="main",
                   help="commit whose evaluate.py is the baseline ('' to time this tree only)")
    p.add_argument("--only", choices=["baseline", "new"], default=None,
                   help="time one side only, keeping the other's last time on the same input "
                        "(each side then fits its own turn of a shared lock)")
    p.add_argument("--work", default="/tmp/evaluate-speed", help="cached inputs and outputs")
    p.add_argument("--driver-memory", default="6g", help="Spark driver memory (local[2])")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "evaluate_speed"))
    a = p.parse_args(argv)
    sizes = a.sizes.split(",")
    if bad := set(sizes) - {"yahoo", "small", "ml100k"}:
        p.error(f"--sizes: unknown {sorted(bad)}; choose from yahoo, small, ml100k")
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    stamp = report.stamp("evaluate_speed.py", argv)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True).stdout.strip())
    base = baseline_tree(work, a.baseline) if a.baseline else None
    mlflow_uri = f"sqlite:///{work / 'mlflow.db'}"
    from mlflow.tracking import MlflowClient  # the store's tables exist before any timed run
    MlflowClient(mlflow_uri).search_experiments()

    inputs = {}
    if "yahoo" in sizes:
        users = round(YAHOO["users"] * a.fraction)
        positives = round(YAHOO["positives"] * a.fraction)
        name = f"yahoo-{a.fraction:g}"
        data = prepare(work, name, ["--dataset", "synthetic", "--users", str(users), "--items",
                                    str(YAHOO["items"]), "--positives", str(positives)],
                       a.driver_memory)
        labels = ["model-a", "model-b"][:a.lists]
        inputs["yahoo"] = (name if a.lists == 2 else f"{name}-1list", data, labels,
                           f"synthetic at {a.fraction:g} of the Yahoo shape ({users:,} users, "
                           f"{YAHOO['items']:,} items, {positives:,} positives), "
                           f"{a.lists} list{'s' if a.lists > 1 else ''}")
    if "small" in sizes:
        data = prepare(work, "ml-latest-small", ["--dataset", "ml-latest-small", "--input",
                                                 str(ROOT / "data" / "ml-latest-small")],
                       a.driver_memory)
        inputs["small"] = ("ml-latest-small", data, ["NCE-AutoRec", "AutoRec", "PureSVD"],
                           "ml-latest-small through the real ETL, 3 lists")
    if "ml100k" in sizes:
        source = Path(a.shared) / "ml-100k" / "u.data"
        if not source.exists():
            p.error(f"--shared {a.shared}: no ml-100k/u.data there; point --shared at the shared "
                    "datasets folder")
        data = prepare(work, "ml-100k", ["--dataset", "ml-100k", "--input", str(source)],
                       a.driver_memory)
        inputs["ml100k"] = ("ml-100k", data, ["NCE-AutoRec", "AutoRec", "PureSVD"],
                            "ml-100k through the real ETL, 3 lists")

    results, before = {}, {}
    previous = Path(a.out).with_suffix(".json")
    if previous.exists():  # a run of some sizes keeps the others' last results, marked as such
        before = json.loads(previous.read_text()).get("results", {})
        results = {name: {**e, "from_an_earlier_run": True} for name, e in before.items()
                   if name not in {n for n, *_ in inputs.values()}}
    for size, (name, data, labels, what) in inputs.items():
        plain = "plain-" if a.plain_lists else ""
        name, what = (f"{name}-plain", f"{what}, plain lists") if plain else (name, what)
        recs = [data.parent / f"recs-{plain}{label}" for label in labels]  # 1 and 2 lists share
        (work / name).mkdir(parents=True, exist_ok=True)
        for seed, (label, r) in enumerate(zip(labels, recs)):
            write_lists(data, r, label, seed, sharded=not a.plain_lists)
        entry = {"input": what, "date": stamp["date"], "commit": head}
        trees = ([("baseline", base[0])] if base else []) + [("new", ROOT)]
        if a.only:  # the other side's time from the last run on the same input (one lock each)
            trees = [t for t in trees if t[0] == a.only]
            old = before.get(name, {})
            if old.get("input") == what:
                entry.update({k: old[k] for k in ("baseline", "new") if k in old and k != a.only})
                entry[f"{'new' if a.only == 'baseline' else 'baseline'}_run"] = old.get("date")
        for which, tree in trees:
            out = work / name / f"eval-{which}"
            print(f"{size}: evaluating with the {which} code ...", flush=True)
            entry[which] = evaluate(tree, data, recs, labels, out, mlflow_uri, a.driver_memory)
            print(f"   {entry[which]}", flush=True)
        if base and "baseline" in entry and "new" in entry:
            entry["ratio"] = round(entry["baseline"]["wall_s"] / entry["new"]["wall_s"], 2)
            entry["parity"] = compare(work / name / "eval-baseline", work / name / "eval-new")
        results[name] = entry

    lines = ["# evaluation/evaluate.py: wall time against its baseline, same run", "",
             f"Command: `{stamp['command']}`  ",
             f"Commit: {head[:12]}{' (with uncommitted changes)' if dirty else ''}; baseline: "
             f"{base[1][:12] if base else 'none'} (`{a.baseline}`).  ",
             f"Machine: {stamp['machine']}; {stamp['date']}; spark-submit --master local[2] "
             f"--driver-memory {a.driver_memory}; MLflow: a SQLite store.", "",
             "Wall time of the whole spark-submit (JVM start, MLflow logging and writing "
             "included); `evaluate` is the manifest's own seconds (the evaluate() call).", "",
             "| input | baseline wall s | new wall s | speed-up | baseline evaluate s | "
             "new evaluate s | max abs difference of the numbers |",
             "|---|---|---|---|---|---|---|"]
    for e in results.values():
        b, n = e.get("baseline", {}), e.get("new", {})
        parity = (f"{e['parity']['max_abs_difference']:.2g} over {e['parity']['numbers']} "
                  "numbers" if "parity" in e else "-")
        earlier = f" (run {e['date']}, commit {e['commit'][:12]})" if e.get("from_an_earlier_run") \
            else ""
        lines.append(f"| {e['input']}{earlier} | {b.get('wall_s', '-')} | {n.get('wall_s', '-')} | "
                     f"{str(e['ratio']) + 'x' if 'ratio' in e else '-'} | "
                     f"{b.get('evaluate_seconds', '-')} | {n.get('evaluate_seconds', '-')} | "
                     f"{parity} |")
    for name, e in results.items():
        if "phases_s" in e.get("new", {}):
            lines += ["", f"New code's phases on {name} (seconds): "
                      + ", ".join(f"{k} {v}" for k, v in e["new"]["phases_s"].items())]
    report.publish(Path(a.out), {**stamp, "commit": head, "dirty": dirty,
                                 "baseline": base[1] if base else None, "results": results},
                   lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
