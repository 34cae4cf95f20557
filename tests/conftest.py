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
# Datasets that may not be shipped (ml-100k's terms forbid it) come from NCE_DATASETS=DIR (DIR/NAME/...),
# else ../shared/datasets beside the clone. Without them their tests are skipped, named in one summary
# line; CI sets NCE_REQUIRE_DATASETS=1, where a missing dataset fails instead (it must run them all).
SHARED = Path(os.environ.get("NCE_DATASETS") or os.environ.get("NCE_SHARED_DATASETS")
              or ROOT.parent / "shared" / "datasets")
REQUIRE_DATASETS = os.environ.get("NCE_REQUIRE_DATASETS") == "1"
SKIP_PREFIX = "dataset file "


def need_dataset(relative: str) -> Path:
    """``SHARED/relative``, or skip the test (fail under NCE_REQUIRE_DATASETS=1) saying how to get it."""
    path = SHARED / relative
    if not path.exists():
        how = (f"{SKIP_PREFIX}{path} not found: set NCE_DATASETS to a folder holding "
               f"{relative} (python -m etl.fetch {relative.split('/')[0]} downloads it), or clone "
               "the project beside shared/")
        if REQUIRE_DATASETS:
            pytest.fail(how + " (NCE_REQUIRE_DATASETS=1: every dataset test must run)")
        pytest.skip(how)
    return path


def pytest_terminal_summary(terminalreporter):
    """One line naming the datasets whose tests were skipped, and how to run them."""
    reasons = [str(r.longrepr[2]) for r in terminalreporter.stats.get("skipped", [])
               if isinstance(r.longrepr, tuple) and SKIP_PREFIX in str(r.longrepr[2])]
    if reasons:
        files = sorted({r.split(SKIP_PREFIX, 1)[1].split(" not found")[0] for r in reasons})
        terminalreporter.write_line(
            f"datasets: {len(reasons)} test(s) skipped: not found: {', '.join(files)}; set "
            "NCE_DATASETS=DIR (python -m etl.fetch NAME downloads them) to run them", yellow=True)


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    """The folder of datasets that may not be shipped (ml-100k may be read from there, never copied
    into the project); tests that need it are skipped without it."""
    need_dataset("ml-100k/u.data")
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


# the shipped ml-latest-small cut to its items with at least this many ratings: 2,269 of 9,724
# items, 609 users, 41k positives, about ml-100k's shape. The whole catalogue (7,363 items with a
# positive) made the per-user fold-ins of BPR, CML and CDAE, which scale with the items, about 1.5x
# slower, and a few epochs learned less than a floor can check.
MIN_ITEM_RATINGS = 10


@pytest.fixture(scope="session")
def small_prepared(spark, tmp_path_factory) -> Path:
    """The shipped ml-latest-small (its items with at least ``MIN_ITEM_RATINGS`` ratings) prepared
    by the real ETL once per session (100 negatives per user: enough for the NS head, small enough
    to read fast; the rows in one Parquet file, the case where Ray Data's block split once handed
    every row to one rank). Shipped, so every clone runs the tests that need real data; only
    readers of datasets that may not be shipped need NCE_DATASETS."""
    import pandas as pd

    from etl.config import ETLConfig
    from etl.prepare import run

    base = tmp_path_factory.mktemp("prepared")
    ratings = pd.read_csv(ROOT / "data" / "ml-latest-small" / "ratings.csv")
    counts = ratings["movieId"].value_counts()
    kept = ratings[ratings["movieId"].isin(counts.index[counts >= MIN_ITEM_RATINGS])]
    (base / "raw").mkdir()
    kept.to_csv(base / "raw" / "ratings.csv", index=False)
    out = base / "ml-latest-small"
    run(ETLConfig(dataset="ml-latest-small", input=(str(base / "raw" / "ratings.csv"),),
                  output=str(out), negatives=100, shards=1), spark)
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
    from runtime.raycluster import apply_ray_env

    base = tmp_path_factory.mktemp("stack")
    config = base / "server.json"
    mlflow_port, ray_port, dashboard_port = services.free_ports(3)
    config.write_text(json.dumps({"port": mlflow_port, "state_dir": str(base / "mlflow")}))
    state = base / "state"
    stop_stack_on_sigterm(state)
    try:
        record = stack.start(ray_port=ray_port, dashboard_port=dashboard_port,
                             num_cpus=3, state=state, mlflow_config=config, log=lambda s: None,
                             owner=os.getpid())
        # the session's clients (this driver, ray job submit in tests) use the stack's own token
        os.environ.update(stack.client_env(record))
        apply_ray_env(record["ray"].address)  # a driver of a head on loopback (LOOPBACK_ENV)
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


# the fixtures that start a real service: a test using one (directly or through another fixture)
# is in that tier whether or not its module says so, so that the fast tier (`make test-fast`,
# -m 'not spark and not ray') never starts a Spark session or the stack
SERVICE_MARKS = {"spark": "spark", "small_prepared": "spark", "local_stack": "ray",
                 "mlflow_server": "ray", "ray_head": "ray"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        uses = SERVICE_MARKS.keys() & set(getattr(item, "fixturenames", ()))
        for fixture in uses:
            mark = SERVICE_MARKS[fixture]
            if mark not in {m.name for m in item.iter_markers()}:
                item.add_marker(getattr(pytest.mark, mark))
        # make test's first process (tests/tiers.py): the tests of the session's Spark session
        # and stack, and every Spark test (some start an in-process session of their own); the
        # Ray tests that bring their own stack, and the Spark tests marked standalone (a
        # spark-submit JVM of their own, nothing in-process), run in the second process
        if uses or (item.get_closest_marker("spark")
                    and not item.get_closest_marker("standalone")):
            item.add_marker(pytest.mark.session)
