"""Shared fixtures: one local SparkSession for the whole run, and the shared real datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NCE_SHARED_DATASETS", ROOT.parent / "shared" / "datasets"))


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """``../shared/datasets`` (ml-100k may be read from there, never copied into the project)."""
    if not (SHARED / "ml-100k" / "u.data").exists():
        pytest.fail(f"shared datasets not found at {SHARED}; clone the project beside shared/ "
                    f"or set NCE_SHARED_DATASETS")
    return SHARED


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by every Spark test (starting one takes ~10 s)."""
    os.environ.setdefault("SPARK_MASTER", "local[2]")
    os.environ.setdefault("SPARK_DRIVER_MEMORY", "2g")
    from etl.spark import get_spark

    session = get_spark("tests", {"spark.sql.shuffle.partitions": "4",
                                  "spark.default.parallelism": "2"})
    yield session
    session.stop()
