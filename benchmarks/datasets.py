"""The real datasets the quality benchmarks run on, prepared by the real ETL.

``prepare(name, shared, work)`` runs ``spark-submit etl/prepare.py`` on one of them (local[2]) and
returns the prepared folder. ml-100k and citeulike-a are read from ``../shared/datasets`` (never
copied into the project: their terms forbid it); ml-latest-small from the shipped ``data/``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from infra.submit import spark_submit

ROOT = Path(__file__).resolve().parents[1]

DATASETS = {  # name -> (ETL --dataset, input path relative to --shared, or to the repo for data/)
    "ml-100k": ("ml-100k", "shared:ml-100k/u.data"),
    "ml-latest-small": ("ml-latest-small", "repo:data/ml-latest-small/ratings.csv"),
    "citeulike-a": ("citeulike-a", "shared:citeulike-a/users.dat"),
}


def prepare(name: str, shared: Path, work: Path) -> Path:
    dataset, source = DATASETS[name]
    base, rel = source.split(":", 1)
    raw = (shared if base == "shared" else ROOT) / rel
    out = work / name
    cmd, env = spark_submit("etl/prepare.py", "--dataset", dataset, "--input", str(raw),
                            "--output", str(out), "--quiet", master="local[2]", driver_memory="3g")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    return out


def synthetic(items: int, per_user: float, users: int, out: Path) -> Path:
    """``spark-submit etl/prepare.py --dataset synthetic`` at a shape (items, positives per user)
    with ``users`` users, no negatives, no cold users, into ``out``; an ``out`` already prepared
    (a benchmark's ``--work`` folder from an earlier run) is reused as it is."""
    if (out / "manifest.json").exists():
        return out
    cmd, env = spark_submit("etl/prepare.py", "--dataset", "synthetic", "--users", str(users),
                            "--items", str(items), "--positives", str(int(users * per_user)),
                            "--negatives", "0", "--cold-users", "0", "--output", str(out),
                            "--overwrite", "-q", master="local[2]", driver_memory="4g")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    return out
