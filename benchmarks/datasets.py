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
