"""One way to get a SparkSession, under ``spark-submit`` or plain ``python``.

Under spark-submit the master, memory and cluster settings come from its flags and are left alone.
Under plain python a local session is started (``SPARK_MASTER`` or ``local[*]``; driver memory from
``SPARK_DRIVER_MEMORY``, default 4g). Either way the project's packages are shipped to the
executors as a zip, so the same code runs on a laptop and on a cluster.

In local mode nothing listens beyond this machine unless the user says so: the driver binds to
127.0.0.1, and so does the web UI (Spark binds it to ``SPARK_LOCAL_IP``, else to every
interface). Under plain python ``SPARK_LOCAL_IP`` is set before the JVM starts; a bare
``spark-submit`` has started its JVM already, so there the UI is switched off unless
``SPARK_LOCAL_IP`` or ``spark.ui.enabled`` is given (the log line says so).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from prepared.errors import UsageError
from runtime.publish import pid_alive

log = logging.getLogger("etl")

ROOT = Path(__file__).resolve().parents[1]
# the heap Spark keeps for itself (its RESERVED_SYSTEM_MEMORY_BYTES): a broadcast has the rest
SPARK_RESERVED = 300 << 20
PACKAGES = ("prepared", "runtime", "models", "etl", "evaluation")  # what executors import


def java_check() -> None:
    """Fail with the install command when no Java runtime is found (PySpark 4 needs Java 17+)."""
    if os.environ.get("JAVA_HOME") and Path(os.environ["JAVA_HOME"], "bin", "java").exists():
        return
    if shutil.which("java"):
        return
    raise SystemExit("Java 17 or newer is required by Spark and none was found. Install it, e.g. "
                     "'sudo apt-get install -y openjdk-17-jre-headless' (Debian/Ubuntu) or "
                     "'brew install openjdk@17' (macOS), or set JAVA_HOME to a JDK 17+.")


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


CODE_PREFIX = "nce-autorec-code-"


def _code_zip() -> str:
    """The project's packages as one zip for ``addPyFile`` (rebuilt per session: it is small), in
    a folder named by this process's pid: removed at exit, and by the next session's sweep
    (``sweep_code_folders``) where the process was killed before its exit ran."""
    sweep_code_folders()
    folder = tempfile.mkdtemp(prefix=f"{CODE_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "project.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in PACKAGES:
            for f in (ROOT / pkg).rglob("*.py"):
                zf.write(f, f.relative_to(ROOT))
    return str(path)


def sweep_code_folders(where: str | None = None) -> list[str]:
    """Remove the code folders of this user's processes that no longer run (each ~250 KB, left
    by a SIGKILL: the fault tests kill ETLs on purpose); the removed paths. A folder whose pid is
    alive, is another user's, or is not named ``CODE_PREFIX<pid>-...`` is left alone."""
    removed = []
    for path in Path(where or tempfile.gettempdir()).glob(f"{CODE_PREFIX}*-*"):
        pid = path.name[len(CODE_PREFIX):].split("-", 1)[0]
        try:
            mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def loopback_conf(master: str, submitted: dict[str, str]) -> dict[str, str]:
    """Settings keeping a local-mode driver and UI on 127.0.0.1; ``submitted``: what the user
    configured already (spark-submit's ``--conf``), which always wins. Empty for cluster masters,
    whose executors must reach the driver from other machines."""
    if not master.startswith("local"):
        return {}
    host = os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
    conf = {k: host for k in ("spark.driver.bindAddress", "spark.driver.host") if k not in submitted}
    if not os.environ.get("SPARK_LOCAL_IP") and "spark.ui.enabled" not in submitted:
        if under_spark_submit():
            conf["spark.ui.enabled"] = "false"
            log.info("Spark UI off: under a bare spark-submit it would listen on every interface; "
                     "run with SPARK_LOCAL_IP=127.0.0.1 (or --conf spark.ui.enabled=true) to have it")
        else:
            os.environ["SPARK_LOCAL_IP"] = host  # read by the JVM this process is about to start
    return conf


def get_spark(app_name: str, conf: dict[str, str] | None = None):
    """A SparkSession for ``app_name`` with ``conf`` applied (session-level settings only)."""
    java_check()
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if under_spark_submit():
        # spark-submit's settings live in its JVM; a SparkConf reads them only once connected
        SparkContext._ensure_initialized()
        submitted = dict(SparkConf().getAll())
        master = submitted.get("spark.master", "")
    else:
        submitted, master = {}, os.environ.get("SPARK_MASTER", "local[*]")
    for k, v in loopback_conf(master, submitted).items():
        builder = builder.config(k, v)
    if not under_spark_submit():
        builder = (builder.master(os.environ.get("SPARK_MASTER", "local[*]"))
                   .config("spark.driver.memory", os.environ.get("SPARK_DRIVER_MEMORY", "4g"))
                   .config("spark.ui.showConsoleProgress", "false"))
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Output shards are shuffle partitions; coalescing them would undo the sharding.
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
    }
    if not os.environ.get("PYSPARK_PYTHON"):
        # Python workers must run this interpreter (the venv), not whatever `python3` is on PATH;
        # PySpark reads the variable (not the conf) when it creates the context.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    for k, v in {**defaults, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    if not getattr(spark, "_nce_code_shipped", False):
        spark.sparkContext.addPyFile(_code_zip())
        spark._nce_code_shipped = True
    return spark


class heartbeat:
    """``with heartbeat(spark, "per-user metrics", logger):`` logs, every ``every`` seconds while
    the block runs, how far Spark's active stages are (tasks done / total), so that one long action
    (minutes at millions of users) shows progress. Quiet when the block is short."""

    def __init__(self, spark, what: str, logger: logging.Logger, every: float = 30.0):
        import threading

        self.spark, self.what, self.log, self.every = spark, what, logger, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import time

        t0 = time.perf_counter()
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.wait(self.every):
            stages = [s for s in (tracker.getStageInfo(i) for i in tracker.getActiveStageIds())
                      if s is not None]
            done = sum(s.numCompletedTasks for s in stages)
            total = sum(s.numTasks for s in stages)
            where = f"{done}/{total} tasks of {len(stages)} active stage(s)" if stages else \
                "between stages"
            self.log.info("%s: %.0fs, %s", self.what, time.perf_counter() - t0, where)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


#: tasks per core for a pass whose values (shards, partitions) each take well under a second:
#: enough to balance the cores, few enough that the tasks' start-up stays small
TASKS_PER_CORE = 4


def few_tasks(spark) -> int:
    """``TASKS_PER_CORE`` tasks for each core Spark has (``one_task_each``'s ``tasks``)."""
    return TASKS_PER_CORE * spark.sparkContext.defaultParallelism


def one_task_each(spark, values: list, schema: str, tasks: int | None = None):
    """A DataFrame of one row per value (one column, ``schema`` in DDL: ``name type``), each in
    its own partition, or with ``tasks``, in that many partitions of consecutive values: a
    ``mapInArrow`` over it runs one Spark task per partition, for work that reads and writes its
    own files with pyarrow inside the task.

    The rows come from ``spark.range`` and a literal array, all in the JVM: a DataFrame made
    from a parallelized Python list runs a Python stage of its own first (1-4 s for 98 values
    on 2 cores, measured 2026-12-07), and each task costs ~60 ms of Python start-up, which
    ``tasks`` lets a cheap per-value pass spread over fewer tasks."""
    from pyspark.sql import functions as F

    name, kind = schema.split(None, 1)
    n = len(values)
    parts = max(1, min(tasks or n, n))
    lookup = F.array(*[F.lit(v) for v in values]) if n else F.array()
    return spark.range(0, n, 1, parts).select(
        F.element_at(lookup, (F.col("id") + 1).cast("int")).cast(kind).alias(name))


def shard_tasks(spark, shards: list[str], tasks: int | None = None):
    """One task per shard (``shard string``, ``one_task_each``), or ``tasks`` tasks of
    consecutive shards: the unit in which scoring writes the lists and evaluation reads them
    beside the rows."""
    return one_task_each(spark, shards, "shard string", tasks)


def broadcast_room(spark) -> int:
    """Bytes a broadcast may take in the driver's heap: the JVM's maximum less Spark's reserve."""
    return int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()) - SPARK_RESERVED


def check_broadcast(nbytes: int, room: int, what: str) -> None:
    """Refuse, with the flag that fixes it, a broadcast of ``nbytes`` that ``room`` (the driver's
    ``broadcast_room``) cannot hold: the driver stores a broadcast whole, and one too large fails
    as a JVM OutOfMemoryError deep in py4j. Measured (2026-12-06, Spark 4.3, local mode): a 1 GiB
    heap held 700 MB of bytes and failed at 850 MB; 2 GiB held 1.5 GB."""
    if nbytes <= room:
        return
    gib = math.ceil((nbytes + SPARK_RESERVED) * 1.25 / 2**30)
    raise UsageError(
        f"{what} are {nbytes / 2**30:.2f} GiB, more than Spark's driver can broadcast with its "
        f"{(room + SPARK_RESERVED) / 2**30:.1f} GiB heap: give it --driver-memory {gib}g "
        f"(spark-submit; on a cluster --executor-memory {gib}g too), or SPARK_DRIVER_MEMORY={gib}g "
        "under plain python")
