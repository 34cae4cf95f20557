"""How the project's own commands call its entry points: ``spark-submit`` of this venv (this
interpreter for the Python driver and workers, loopback networking, quiet JVM logs) and
``ray job submit`` of the repository as the job's working directory."""

from __future__ import annotations

import os
import re
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


# What `ray job submit` prints around the job's own output: its banners (the package upload, "Job
# ... submitted successfully", "Next steps", "Tailing logs"), and within the job's output Ray's
# INFO records and the lines of Ray Train's controller and Ray Data's actors. A user reads the
# stages' progress; Ray's lines are held back and printed when the job fails, where they help.
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray's log records (ray_constants.LOGGER_FORMAT): its CLI's lines in a pipe (not a terminal),
# and its loggers' in the job's driver
RAY_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\t(?P<level>[A-Z]+) \S+:\d+ -- "
                        r"(?P<message>.*)$")
QUIET_LEVELS = {"INFO", "SUCC", "VINFO", "VVINFO", "DEBUG"}
WORKER = re.compile(r"^\(RayTrainWorker pid=\d+(?:, ip=[^)]*)?\) ")
RAY_ACTOR = re.compile(r"^\((?!RayTrainWorker )[A-Za-z_]\w* pid=\d+[^)]*\) ")
WORKER_NOISE = ("Setting up process group for", "Progress bars disabled")
RAY_LINES = ("Running entrypoint for job ",)  # the job supervisor's, before the job's own
TROUBLE = re.compile(r"(?i)error|fail|restart|retry")
TAILING = "Tailing logs until the job exits"
SUBMITTED = re.compile(r"^Job '([^']+)' submitted successfully")
ENDED = re.compile(r"^Job '([^']+)' (succeeded|failed|was stopped)")


class RayJobOutput:
    """Sorts the lines of one `ray job submit` into the job's own, to show (Ray's colour codes and
    the training workers' ``(RayTrainWorker pid=N)`` prefixes removed), and Ray's, kept in
    ``held``. ``job_id`` and ``status`` ("succeeded", "failed", ...) come from Ray's banners."""

    def __init__(self):
        self.tailing = False
        self.held: list[str] = []
        self.job_id: str | None = None
        self.status: str | None = None

    def show(self, line: str) -> str | None:
        """The text to print for ``line`` (no newline), or None when the line is Ray's or blank."""
        plain = ANSI.sub("", line).rstrip("\n")
        record = RAY_RECORD.match(plain)
        bare = (record["message"] if record else plain).strip()
        if m := SUBMITTED.match(bare):
            self.job_id = m.group(1)
        if m := ENDED.match(bare):
            self.job_id, self.status = m.groups()
        if TAILING in bare:
            self.tailing = True
            self.held.append(plain)
            return None
        if not bare:
            return None
        text = WORKER.sub("", plain)
        ours = (self.tailing and self.status is None and set(bare) != {"-"}
                and not (record and record["level"] in QUIET_LEVELS)
                and not any(n in text for n in WORKER_NOISE)
                and not bare.startswith(RAY_LINES)
                and (not RAY_ACTOR.match(plain) or TROUBLE.search(plain)))
        if not ours:
            self.held.append(plain)
            return None
        return text
