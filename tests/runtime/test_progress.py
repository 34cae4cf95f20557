"""runtime.progress: the lines a long Spark stage prints, their counts, and a thread that ends."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace

import pytest

from runtime.progress import Counts, describe, duration, group_counts, spark_progress

TASKS = re.compile(r"([\d,]+)/([\d,]+) tasks \((\d+)%\)")


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (0, 44.6, 70, 3599, 7500)] == [
        "0 s", "45 s", "1 min 10 s", "59 min 59 s", "2 h 5 min"]


def test_a_line_has_stage_tasks_users_rate_and_time_left():
    c = Counts(stages=4, stages_done=2, active=1, tasks=80, tasks_done=40)
    assert describe("scoring", c, 65, rate=0.5, total_users=1_000) == (
        "scoring: stage 3/4, 40/80 tasks (50%), ~500/1,000 users, 6 users/s, ~1 min 20 s left "
        "(1 min 5 s so far)")
    assert describe("x", c, 5, rate=None) == "x: stage 3/4, 40/80 tasks (50%) (5 s so far)"
    two = Counts(stages=5, stages_done=1, active=2, tasks=10, tasks_done=3, failed=1)
    assert describe("x", two, 1, rate=2.0).startswith(
        "x: stages 2-3/5, 3/10 tasks (30%), 1 failed and retried, 2.00 tasks/s, ~4 s left")
    assert "no Spark job started yet" in describe("x", Counts(), 1, None)
    assert "no stage running" in describe("x", Counts(1, 1, 0, 4, 4), 1, None)


class FakeTracker:
    """Jobs and stages as Spark's status tracker reports them (stage ids are py4j arrays there)."""

    def __init__(self):
        self.jobs = {}      # group -> {job id: (stage ids, status)}
        self.stages = {}    # stage id -> [numTasks, numActiveTasks, numCompletedTasks, failed]
        self.active = set()

    def getJobIdsForGroup(self, group):
        return list(self.jobs.get(group, {}))

    def getJobInfo(self, job_id):
        for jobs in self.jobs.values():
            if job_id in jobs:
                return SimpleNamespace(jobId=job_id, stageIds=jobs[job_id][0], status=jobs[job_id][1])
        return None

    def getActiveStageIds(self):
        return sorted(self.active)

    def getStageInfo(self, sid):
        if sid not in self.stages:
            return None
        n, act, done, failed = self.stages[sid]
        return SimpleNamespace(stageId=sid, numTasks=n, numActiveTasks=act,
                               numCompletedTasks=done, numFailedTasks=failed)


def test_counts_skip_skipped_stages_and_count_shared_ones_once():
    t = FakeTracker()
    t.jobs["g"] = {1: ([0, 1], "SUCCEEDED"),    # stage 1 skipped: its job ended, 0 of 3 done
                   2: ([0, 2, 3], "RUNNING")}   # stage 0 shared (AQE), 2 running, 3 pending
    t.jobs["other"] = {3: ([9], "RUNNING")}     # another group's job: not counted
    t.stages = {0: [4, 0, 4, 0], 1: [3, 0, 0, 0], 2: [10, 2, 6, 1], 3: [5, 0, 0, 0], 9: [99, 9, 1, 0]}
    t.active = {2, 9}
    assert group_counts(t, "g") == Counts(stages=3, stages_done=1, active=1, tasks=19,
                                          tasks_done=10, failed=1)
    assert group_counts(t, "nobody") == Counts()


class FakeSpark:
    def __init__(self, tracker):
        self.props = {}
        self.sparkContext = SimpleNamespace(
            statusTracker=lambda: tracker, getLocalProperty=self.props.get,
            setLocalProperty=lambda k, v: self.props.__setitem__(k, v))


def test_rate_and_time_left_follow_the_recent_intervals_and_phases_count_apart():
    t, now = FakeTracker(), [100.0]
    spark = FakeSpark(t)
    p = spark_progress(spark, "scoring", total_users=8_000, log=None, clock=lambda: now[0])
    with p:
        group = spark.props["spark.jobGroup.id"]
        t.jobs[group] = {0: ([0], "RUNNING")}
        t.stages[0], t.active = [80, 2, 0, 0], {0}
        now[0] = 130.0
        assert p.line() == "scoring: stage 1/1, 0/80 tasks (0%), ~0/8,000 users (30 s so far)"
        t.stages[0][2], now[0] = 20, 160.0    # 20 tasks in 60 s from the start
        assert p.line().endswith("20/80 tasks (25%), ~2,000/8,000 users, 33 users/s, "
                                 "~3 min 0 s left (1 min 0 s so far)")
        p.phase("writing")
        assert spark.props["spark.jobGroup.id"] != group  # its jobs go to a group of their own
        now[0] = 170.0
        assert p.line() == "scoring (writing): no Spark job started yet (1 min 10 s so far)"
    assert spark.props["spark.jobGroup.id"] is None  # put back: there was none
    with pytest.raises(ValueError, match="every=0"):
        spark_progress(spark, "x", every=0)


def slow_partition(seconds: float = 0.5):
    """A partition function that takes ``seconds``; made in a closure, so cloudpickle ships it by
    value (Spark's Python workers cannot import this test module by name)."""
    def slow(rows):
        time.sleep(seconds)
        return rows
    return slow


@pytest.mark.spark
def test_a_slow_spark_job_reports_its_progress_and_the_thread_ends(spark):
    sc = spark.sparkContext
    sc.parallelize(range(10), 10).count()  # before the block: not its jobs
    lines: list[str] = []
    with spark_progress(spark, "slow", every=0.2, log=lines.append) as p:
        sc.parallelize(range(80), 8).mapPartitions(slow_partition()).count()
    assert not p.thread.is_alive() and p.thread not in threading.enumerate()
    counted = [tuple(int(x.replace(",", "")) for x in m.groups())
               for m in map(TASKS.search, lines) if m]
    assert len(counted) >= 2, lines
    assert all(done <= total == 8 for done, total, _ in counted), lines  # its own 8 tasks only
    shares = [pct for _, _, pct in counted]
    assert shares == sorted(shares) and shares[-1] > shares[0], lines
    assert any("tasks/s" in ln and "left" in ln for ln in lines), lines
    assert sc.getLocalProperty("spark.jobGroup.id") is None


@pytest.mark.spark
def test_the_thread_ends_and_the_group_is_restored_when_the_block_raises(spark):
    sc = spark.sparkContext
    sc.setLocalProperty("spark.jobGroup.id", "outer")  # as sc.setJobGroup("outer", ...) sets it
    try:
        with pytest.raises(RuntimeError, match="boom"), \
                spark_progress(spark, "failing", every=0.1, log=lambda _: None) as p:
            assert sc.getLocalProperty("spark.jobGroup.id").startswith("progress-")
            sc.parallelize(range(4), 2).mapPartitions(slow_partition()).count()
            raise RuntimeError("boom")
        assert not p.thread.is_alive()
        assert not [t for t in threading.enumerate() if t.name.startswith("spark-progress")]
        assert sc.getLocalProperty("spark.jobGroup.id") == "outer"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)


@pytest.mark.spark
def test_scoring_and_evaluation_log_progress_lines(spark, small_prepared, tmp_path, caplog):
    """The CLIs' work reports through the helper (a tiny interval: ml-latest-small takes seconds)."""
    import logging

    from evaluation.evaluate import evaluate
    from evaluation.score import score
    from tests.evaluation.test_score_evaluate import save_model

    save_model(tmp_path / "model", small_prepared)
    with caplog.at_level(logging.INFO, "evaluation"):
        scored = score(spark, progress_every=0.05, model=str(tmp_path / "model"), data=str(small_prepared),
              output=str(tmp_path / "recs"))
        evaluate(spark, progress_every=0.05, recs=[str(tmp_path / "recs")],
                 data=str(small_prepared), output=str(tmp_path / "eval"), no_mlflow=True)
    lines = [r.getMessage() for r in caplog.records]
    scoring = [ln for ln in lines if ln.startswith("scoring: ")]
    users = f"/{scored['scored_users']:,} users"
    assert any(TASKS.search(ln) and users in ln for ln in scoring), lines
    assert any(ln.startswith("evaluation (per-user metrics): ") for ln in lines), lines
    assert not [t for t in threading.enumerate() if t.name.startswith("spark-progress")]


def test_mlflow_bars_are_off_in_logs_and_a_users_setting_wins(monkeypatch):
    import io
    import os

    from runtime.logs import no_bars_in_logs

    var = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # a pipe or a file: not a terminal
    no_bars_in_logs()
    assert os.environ[var] == "false"
    monkeypatch.setenv(var, "true")
    no_bars_in_logs()
    assert os.environ[var] == "true"
