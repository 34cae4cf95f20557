"""How the project's own commands call its entry points: ``spark-submit`` of this venv (this
interpreter for the Python driver and workers, loopback networking, quiet JVM logs) and
``ray job submit`` of the repository as the job's working directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG4J = ROOT / "infra" / "log4j2.properties"


def spark_submit(script: str, *args: str, master: str = "local[*]", driver_memory: str = "4g"
                 ) -> tuple[list[str], dict[str, str]]:
    """(command, environment) running ``ROOT/script`` with ``args`` under spark-submit."""
    env = {"SPARK_LOCAL_IP": "127.0.0.1", **os.environ,
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", master,
           "--driver-memory", driver_memory,
           "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J}",
           str(ROOT / script), *args]
    return cmd, env


def ray_job_submit(address: str, entrypoint: list[str], auth: dict[str, str]
                   ) -> tuple[list[str], dict[str, str]]:
    """(command, environment) submitting ``entrypoint`` to the Ray job server at ``address``,
    with the repository as working directory (uploaded; .gitignore'd paths stay behind).
    ``auth``: the head's token settings (``Service.env``, ``stack.client_env``)."""
    env = {**os.environ, **auth}
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", address,
           "--working-dir", str(ROOT), "--", *entrypoint]
    return cmd, env
