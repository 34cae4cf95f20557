"""Progress lines for long Spark work: tasks done of total, rate and time left, every 30 s.

    with spark_progress(spark, "scoring", total_users=n_users, log=log.info):
        recs.write.parquet(out)

prints, while the block runs, one line per interval such as
``scoring: stage 1/1, 37/80 tasks (46%), ~462,500/1,000,000 users, 12,400 users/s, ~1 min 10 s
left (40 s so far)``. Spark's own console progress bar is off (it garbles logs and is one line
per stage at best), and a job of minutes with no output looks hung.

The block's jobs run in a job group of their own (a local property of the calling thread, as
``SparkContext.setJobGroup`` sets it), so the counts are the block's jobs only, never another
thread's or an earlier block's. ``phase("...")`` starts a new group with a new label, so one
block can cover a function of several Spark actions and count each action on its own. Counts come
from Spark's status tracker, whose figures lag the listener bus by up to a fraction of a second.

Time left is the tasks still to run at the rate of the last few intervals: an estimate, good once
tasks are of similar size (a stage's partitions), rough across stages. Users done (when the block
is told its number of users) are estimated the same way, from the share of tasks done; Spark
reports records only when a task ends, so counting them exactly would be no more timely.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

EVERY = 30.0  # seconds between lines: often enough that a run never looks hung
GROUP = "spark.jobGroup.id"  # SparkContext.SPARK_JOB_GROUP_ID: what setJobGroup sets
FINISHED = ("SUCCEEDED", "FAILED")
WINDOW = 5  # samples the rate is measured over: a few intervals, so it follows a new stage


@dataclass(frozen=True)
class Counts:
    """What Spark knows of one job group: stages that run or will run (skipped ones left out),
    tasks of those stages."""

    stages: int = 0           # stages known
    stages_done: int = 0
    active: int = 0           # stages running now
    tasks: int = 0
    tasks_done: int = 0
    failed: int = 0           # failed task attempts (retried by Spark)


def group_counts(tracker, group: str) -> Counts:
    """``Counts`` of the jobs of ``group``. A stage of several jobs counts once; a stage left
    pending by a finished job was skipped (its shuffle output existed) and does not count."""
    jobs = [j for j in map(tracker.getJobInfo, tracker.getJobIdsForGroup(group)) if j is not None]
    active = set(tracker.getActiveStageIds())
    open_stages, stage_ids = set(), set()
    for job in jobs:
        ids = set(int(s) for s in job.stageIds)
        stage_ids |= ids
        if job.status not in FINISHED:
            open_stages |= ids
    c = dict(stages=0, stages_done=0, active=0, tasks=0, tasks_done=0, failed=0)
    for sid in sorted(stage_ids):
        s = tracker.getStageInfo(sid)
        if s is None:  # not yet known, or dropped (spark.ui.retainedStages)
            continue
        done = min(s.numCompletedTasks, s.numTasks)
        running = sid in active
        if done < s.numTasks and not running and sid not in open_stages:
            continue  # skipped
        c["stages"] += 1
        c["stages_done"] += done >= s.numTasks and not running
        c["active"] += running
        c["tasks"] += s.numTasks
        c["tasks_done"] += done
        c["failed"] += s.numFailedTasks
    return Counts(**c)


def duration(seconds: float) -> str:
    """``45 s``, ``1 min 10 s``, ``2 h 5 min``: how people say a time span."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def describe(what: str, c: Counts, elapsed: float, rate: float | None,
             total_users: int | None = None) -> str:
    """One progress line. ``rate``: tasks per second lately (None: not measured yet)."""
    so_far = f"({duration(elapsed)} so far)"
    if c.stages == 0:
        return f"{what}: no Spark job started yet {so_far}"
    if c.active == 0:
        return (f"{what}: {c.stages_done}/{c.stages} stage(s) done, {c.tasks_done:,}/{c.tasks:,} "
                f"tasks; no stage running (driver work or the next job starting) {so_far}")
    first = c.stages_done + 1
    last = min(c.stages_done + c.active, c.stages)
    stage = f"stage {first}/{c.stages}" if last == first else f"stages {first}-{last}/{c.stages}"
    share = c.tasks_done / c.tasks if c.tasks else 0.0
    parts = [stage, f"{c.tasks_done:,}/{c.tasks:,} tasks ({share:.0%})"]
    if c.failed:
        parts.append(f"{c.failed:,} failed and retried")
    if total_users and c.tasks:
        parts.append(f"~{total_users * share:,.0f}/{total_users:,} users")
    if rate:
        parts.append(f"{rate * total_users / c.tasks:,.0f} users/s" if total_users and c.tasks
                     else f"{rate:,.2f} tasks/s")
        parts.append(f"~{duration((c.tasks - c.tasks_done) / rate)} left")
    return f"{what}: {', '.join(parts)} {so_far}"


def info_lines(logger: logging.Logger) -> Callable[[str], None] | None:
    """``logger.info`` as a progress ``log``, or None (no thread at all) where the logger would
    drop INFO lines, as under a CLI's ``--quiet``."""
    return logger.info if logger.isEnabledFor(logging.INFO) else None


class spark_progress:
    """Context manager: while its block runs, ``log`` gets one progress line of the block's Spark
    jobs every ``every`` seconds (``log=None``: silent, e.g. under ``--quiet``). The reporting
    thread is a daemon and is joined when the block ends, also on an exception; the thread's
    job group is put back as it was. ``clock`` is for tests."""

    def __init__(self, spark, what: str, every: float = EVERY, total_users: int | None = None,
                 log: Callable[[str], None] | None = print,
                 clock: Callable[[], float] = time.monotonic):
        if every <= 0:
            raise ValueError(f"every={every}: the interval between progress lines must be > 0 s")
        self.sc, self.what, self.every, self.log, self.clock = spark.sparkContext, what, every, \
            log, clock
        self._base = f"progress-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._phases = 0
        self._label, self._group, self._users = what, self._base, total_users
        self._t0 = self._phase_t0 = clock()
        self._samples: deque = deque(maxlen=WINDOW)
        self.thread: threading.Thread | None = None

    def phase(self, name: str, total_users: int | None = None) -> None:
        """From now on the block's jobs are counted as ``what (name)``, apart from earlier ones:
        a new job group for this thread, and a fresh rate."""
        with self._lock:
            self._phases += 1
            self._group = f"{self._base}-{self._phases}"
            self._label, self._users = f"{self.what} ({name})", total_users
            self._phase_t0 = self.clock()
            self._samples.clear()
            self.sc.setLocalProperty(GROUP, self._group)

    def line(self) -> str:
        """The progress line now (also what the thread logs). Under the lock: a phase that
        begins meanwhile waits the few milliseconds the status tracker takes to answer."""
        with self._lock:
            c = group_counts(self.sc.statusTracker(), self._group)
            now = self.clock()
            if not self._samples:
                self._samples.append((self._phase_t0, 0))
            self._samples.append((now, c.tasks_done))
            (t_old, d_old), (t_new, d_new) = self._samples[0], self._samples[-1]
            rate = (d_new - d_old) / (t_new - t_old) if t_new > t_old and d_new > d_old else None
            return describe(self._label, c, now - self._t0, rate, self._users)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                text = self.line()
            except Exception:  # noqa: BLE001 (a progress line never breaks the work it watches)
                continue  # e.g. the JVM is going away at the end of the block
            self.log(text)

    def __enter__(self) -> spark_progress:
        self._previous = self.sc.getLocalProperty(GROUP)
        self.sc.setLocalProperty(GROUP, self._group)
        if self.log is not None:
            self.thread = threading.Thread(target=self._run, name=f"spark-progress {self.what}",
                                           daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join()
        self.sc.setLocalProperty(GROUP, self._previous)  # None clears it
