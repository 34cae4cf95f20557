"""Faults of the services under a running training, through the real entry points:

- the MLflow server killed mid-training: training goes on (metrics kept), the end of the run fails
  with the model saved and how to finish; with the server back, a rerun logs every epoch and the
  model without training again;
- the Ray head killed mid-training: the `ray job submit` client fails; on another head the same
  command resumes from the last checkpoint and finishes the run in the same MLflow run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.ray]
# the MLflow fault lands while rank 0 is held at the start of epoch 3 (training.faults.hold_rank0),
# so two epochs run with the server down: no race with the epochs' pace, no epochs to spare
EPOCHS = 4


class Streamed:
    """A subprocess whose combined output is collected by a thread, so the test can wait for a
    line while it runs."""

    def __init__(self, cmd: list[str], env: dict | None = None):
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})
        self.text = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.text += line

    def wait_for(self, pattern: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never saw {pattern!r}; output:\n{self.text[-4000:]}")
            time.sleep(0.2)

    def finish(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        return rc


def train_cmd(data: Path, out: Path, name: str, mlflow_uri: str, *extra: str) -> list[str]:
    # batch 128, not the model's 512: epochs of 5 steps, so the faults land mid-run
    return ["python", "training/train.py", "--data", str(data), "--model", "autorec", "--width",
            "32", "--batch-size", "128", "--epochs", str(EPOCHS), "--patience", str(EPOCHS),
            "--runs-dir", str(out), "--run-name", name, "--mlflow-uri", mlflow_uri, *extra]


def wait_for_file(path: Path, job: Streamed, timeout: float = 300.0) -> None:
    """Wait until ``path`` exists (a hook's marker), failing with the job's output should the
    job end or the time run out first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if job.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{path} never appeared; output:\n{job.text[-4000:]}")
        time.sleep(0.1)


def registered_epoch(run_dir: Path, at_least: int, timeout: float = 120.0) -> int:
    """The epoch of the latest checkpoint Ray Train's controller has registered for ``run_dir``
    (its ``checkpoint_manager_snapshot.json``), once it is ``at_least``; waits on the file."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            latest = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())[
                "latest_checkpoint_result"]
            if latest["metrics"]["epoch"] >= at_least and \
                    (run_dir / latest["checkpoint_dir_name"]).is_dir():
                return latest["metrics"]["epoch"]
        except (OSError, ValueError, KeyError, TypeError):  # not written yet, or mid-write
            pass
        assert time.monotonic() < deadline, f"no checkpoint of epoch {at_least}+ in {run_dir}"
        time.sleep(0.05)


def test_mlflow_killed_during_training_loses_no_run(small_prepared, ray_head, tmp_path):
    from mlflow.tracking import MlflowClient

    from infra.services import free_port, start_mlflow, stop
    from training.faults import RELEASE

    port = free_port()
    server = start_mlflow(tmp_path / "mlflow", port, owner=os.getpid())
    cmd = [sys.executable, *train_cmd(small_prepared, tmp_path / "runs", "mlflow-fault",
                                      server.url, "--num-workers", "1", "--mlflow-wait", "3",
                                      "--ray-address", ray_head.address)[1:]]
    run_dir = tmp_path / "runs" / "mlflow-fault"
    try:
        first = Streamed(cmd, {"NCE_TEST_HOOK": "training.faults:hold_rank0:2"})
        wait_for_file(run_dir / "held.txt", first)
        stop(server.proc)  # the tracking server dies mid-training (rank 0 held at epoch 3)
        (run_dir / RELEASE).write_text("go on\n")
        rc = first.finish()
        assert rc == 1, first.text[-3000:]
        assert re.search(r"warning: MLflow at .* failed at epoch \d", first.text)
        assert re.search(rf"epoch +{EPOCHS}\b", first.text)  # training went on to the end
        assert "model saved at" in first.text and "does not answer" in first.text
        assert "rerun the same command" in first.text
        assert "held rank 0 at the start of epoch 3" in (run_dir / "held.txt").read_text()
        assert (run_dir / "model.pt").exists()
        assert "summary" not in json.loads((run_dir / "run.json").read_text())

        server = start_mlflow(tmp_path / "mlflow", port, owner=os.getpid())  # back, same store
        again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        log = again.stdout + again.stderr
        assert again.returncode == 0, log[-3000:]
        assert "training finished already" in log
        assert not re.search(r"epoch +1\b", log)  # not retrained
        assert re.search(r"MLflow: logged [1-9]\d* epoch\(s\) missed", log)
        summary = json.loads(log.split("SUMMARY ", 1)[1].splitlines()[0])
        client = MlflowClient(server.url)
        run = client.get_run(summary["mlflow_run_id"])
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "valid_ndcg")]
        assert sorted(steps) == list(range(1, EPOCHS + 1))  # every epoch, once
        assert client.search_logged_models(experiment_ids=[run.info.experiment_id])
    finally:
        stop(server.proc)


def test_ray_head_killed_then_a_rerun_resumes_from_the_last_checkpoint(small_prepared, ray_head,
                                                                       mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from infra.services import free_ports, group_alive, ray_token, start_ray_head, stop
    from infra.submit import ray_job_submit

    # the head must die mid-run, and an epoch here takes well under a second while the epoch
    # line reaches this test seconds late: rank 0 waits at the start of epoch 4 (once per run
    # directory, training.faults.hold_rank0) until the head is killed; the rerun goes on
    epochs = 8
    args = ["NCE_TEST_HOOK=training.faults:hold_rank0:3",  # the job's shell sets it
            *train_cmd(small_prepared, tmp_path / "runs", "head-fault", mlflow_server.url,
                       "--epochs", str(epochs), "--patience", str(epochs))]
    # Ray's unix sockets live under its temp dir: keep the path short (107-byte limit)
    short = Path(tempfile.mkdtemp(prefix="nce-rf-"))
    auth = ray_token(short)
    head = start_ray_head(short / "r1", *free_ports(2), num_cpus=3, auth=auth,
                          owner=os.getpid())
    cmd, env = ray_job_submit(head.url, args, auth)
    job = Streamed(cmd, env)
    try:
        job.wait_for(r"epoch +3\b")
        # the kill must come after Ray Train has registered a checkpoint of epoch 2 or later
        # (what the resume below starts from): its controller records it in the run's snapshot
        registered_epoch(tmp_path / "runs" / "head-fault", at_least=2)
        os.killpg(os.getpgid(head.proc.pid), signal.SIGKILL)  # the head crashes
        rc = job.finish(timeout=300)
    finally:
        stop(head.proc, timeout=1)
    assert rc != 0, job.text[-3000:]
    assert not group_alive(head.proc.pid)
    record = json.loads((tmp_path / "runs" / "head-fault" / "run.json").read_text())
    assert "summary" not in record  # interrupted, not finished
    assert "held rank 0 at the start of epoch 4" in (
        tmp_path / "runs" / "head-fault" / "held.txt").read_text()

    shutil.rmtree(short, ignore_errors=True)
    # the same command on another head (the session's, which no longer knows the run: all it
    # has is the run directory's checkpoints and MLflow)
    cmd, env = ray_job_submit(ray_head.url, args, ray_head.env)
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    resumed = int(re.search(r"resuming after epoch (\d+)", log).group(1))
    assert resumed >= 2, log[-3000:]
    assert not re.search(rf"epoch +{resumed}\b", log.split("resuming after epoch")[1])  # not retrained
    summary = json.loads(log.split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["epochs_run"] == epochs and summary["mlflow_run_id"] == record["mlflow_run_id"]
    steps = {m.step for m in MlflowClient(mlflow_server.url).get_metric_history(
        record["mlflow_run_id"], "valid_ndcg")}
    assert steps == set(range(1, epochs + 1))  # one MLflow run holds all epochs of both heads
