"""Shared fixtures: one local SparkSession for the whole run, and the shared real datasets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Ray 2.60's head enables token authentication; a driver joining it must be in token mode before
# ray is first imported (the mode is read into Ray's config at import)
os.environ.setdefault("RAY_AUTH_MODE", "token")
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


@pytest.fixture(scope="session")
def ml100k_prepared(spark, shared_datasets, tmp_path_factory) -> Path:
    """ml-100k prepared by the real ETL once per session (100 negatives per user: enough for the
    NS head, small enough to read fast)."""
    from etl.config import ETLConfig
    from etl.prepare import run

    out = tmp_path_factory.mktemp("prepared") / "ml-100k"
    run(ETLConfig(dataset="ml-100k", input=(str(shared_datasets / "ml-100k" / "u.data"),),
                  output=str(out), negatives=100), spark)
    return out


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (SQLite backend) on loopback, shared by the session."""
    from infra.services import free_port, start_mlflow, stop

    service = start_mlflow(tmp_path_factory.mktemp("mlflow"), free_port())
    yield service
    stop(service.proc)


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """A Ray head with its job server (``ray start --head``) on loopback; this process joins it
    as a driver. 3 logical CPUs: two 1-CPU training workers and one for Ray Data's reads."""
    import ray

    from infra.services import free_port, group_alive, start_ray_head, stop

    service = start_ray_head(tmp_path_factory.mktemp("ray"), free_port(), free_port(), num_cpus=3)
    try:
        ray.init(address=service.address, log_to_driver=True)
        yield service
    finally:
        ray.shutdown()
        stop(service.proc, timeout=5)
    assert not group_alive(service.proc.pid), "the Ray head left processes behind"
