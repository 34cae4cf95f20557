"""Shared fixtures: one local SparkSession for the whole run, and the shared real datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Ray 2.60's head enables token authentication; a driver joining it must be in token mode before
# ray is first imported (the mode is read into Ray's config at import). The token itself is the
# session stack's (``local_stack``), never one from the home directory.
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
    from runtime.spark import get_spark

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


def stop_stack_on_sigterm(state: Path) -> None:
    """A session told to stop (SIGTERM: a timeout, a CI runner) stops its stack within seconds and
    ends as on Ctrl-C, running its teardown; Python's default would end it on the spot, leaving the
    stack to the watchdog."""
    import signal
    import threading

    from infra import stack

    def on_sigterm(signum, frame):
        stack.stop(state, log=lambda s: None, owner=os.getpid(), grace=3)
        raise KeyboardInterrupt("SIGTERM")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """The project's local stack (``infra.stack``: an MLflow server with SQLite and a Ray head with
    its job server, loopback, free ports), started once per session by the real script; stopping
    it at the end must leave no process behind. It is the session's: a watchdog stops it if the
    session dies without its teardown (SIGKILL, a crash), and SIGTERM stops it at once."""
    import ray

    from infra import services, stack

    base = tmp_path_factory.mktemp("stack")
    config = base / "server.json"
    config.write_text(json.dumps({"port": services.free_port(), "state_dir": str(base / "mlflow")}))
    state = base / "state"
    stop_stack_on_sigterm(state)
    try:
        record = stack.start(ray_port=services.free_port(), dashboard_port=services.free_port(),
                             num_cpus=3, state=state, mlflow_config=config, log=lambda s: None,
                             owner=os.getpid())
        # the session's clients (this driver, ray job submit in tests) use the stack's own token
        os.environ.update(stack.client_env(record))
        ray.init(address=record["ray"].address, log_to_driver=True)
        stop_stack_on_sigterm(state)  # again: ray.init puts its own fatal-signal handler in place
        yield SimpleNamespace(state=state, mlflow_config=config, services=record)
    finally:
        ray.shutdown()
        started = stack.read_record(state)  # also what a failed start left running
        stack.stop(state, log=lambda s: None)
    left = [name for name, svc in started.items() if services.group_alive(svc.pgid)]
    assert not left, f"stopping the stack left processes of {left} behind"


@pytest.fixture(scope="session")
def mlflow_server(local_stack):
    """The stack's MLflow tracking server (``.url`` is its tracking URI)."""
    return local_stack.services["mlflow"]


@pytest.fixture(scope="session")
def ray_head(local_stack):
    """The stack's Ray head, which this process joined as a driver (``.url``: job server,
    ``.address``: GCS). 3 logical CPUs: two 1-CPU training workers and one for Ray Data."""
    return local_stack.services["ray"]
