"""A run's request for Ray resources: a local Ray leaves a CPU for Ray Data, a request the
cluster could never hold is refused at once in one line, and a run that waits for resources says
which after a minute instead of waiting in silence (``runtime.raycluster``)."""

from __future__ import annotations

import threading
import time

import pytest

from prepared.errors import UsageError
from runtime import raycluster as rc

IMPOSSIBLE = ("--num-workers 4 --cpus-per-worker 2 needs 8 CPUs for its workers plus 1 for "
              "reading; the cluster has 3; lower --num-workers or --cpus-per-worker, or add nodes")


def test_a_local_ray_leaves_a_cpu_for_reading(monkeypatch):
    monkeypatch.setattr(rc.os, "cpu_count", lambda: 2)
    # the case that waited forever: one worker of 2 CPUs on a 2-core machine
    assert rc.local_cpus(1, 2) == 3
    assert rc.local_cpus(2, 0) == 3      # two workers of 1 CPU (shared out), one for reading
    assert rc.local_cpus(1, 0.5) == 2    # the cores, when the workers leave room anyway
    assert rc.worker_cpus(2, 0, 3) == 1 and rc.worker_cpus(1, 0, 3) == 2


def test_an_impossible_request_is_refused_with_the_sizes_and_the_fix():
    with pytest.raises(UsageError) as e:
        rc.check_fits(4, 2, resources={"CPU": 3.0})
    assert str(e.value) == IMPOSSIBLE
    rc.check_fits(2, 1, resources={"CPU": 3.0})  # 2 x 1 + 1 for reading: fits exactly
    with pytest.raises(UsageError, match="needs 3 CPUs for its workers; the cluster has 2;"):
        rc.check_fits(3, 1, resources={"CPU": 2.0}, reading=False)
    with pytest.raises(UsageError, match="--use-gpu needs 2 GPUs; the cluster has 0"):
        rc.check_fits(2, 1, use_gpu=True, resources={"CPU": 8.0})


def test_the_experiment_refuses_trials_that_cannot_fit(monkeypatch, tmp_path):
    import ray

    from experiment.plan import ExperimentConfig
    from experiment.search import check_trial_fits

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 3.0})
    cfg = ExperimentConfig(data=str(tmp_path), num_workers=4, cpus_per_worker=2)
    with pytest.raises(UsageError, match="^" + IMPOSSIBLE.replace("+", r"\+") + "$"):
        check_trial_fits(cfg, ["autorec", "puresvd"])
    check_trial_fits(ExperimentConfig(data=str(tmp_path), num_workers=2), ["autorec"])


def watchers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ray-start-watch"]


def test_a_driver_joining_the_local_stack_takes_its_token_settings(monkeypatch, tmp_path):
    """``--ray-address 127.0.0.1:6379`` of the stack's head gets the stack's token settings (the
    exports it prints), unless the user set their own; another address or port gets none."""
    import json
    import os
    record = tmp_path / "stack.json"
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "ray_auth_token"),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    record.write_text(json.dumps({"ray": {"address": "127.0.0.1:6379", "env": env}}))
    auth = {k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
    assert rc.stack_auth("127.0.0.1:6379", record) == auth
    assert rc.stack_auth("localhost:6379", record) == auth
    assert rc.stack_auth("127.0.0.1:7000", record) == {}
    assert rc.stack_auth("10.0.0.5:6379", record) == {}
    assert rc.stack_auth("127.0.0.1:6379", tmp_path / "none.json") == {}
    monkeypatch.setattr(rc, "STACK_RECORD", record)
    for k in rc.AUTH_VARS:  # set, then removed: monkeypatch then restores what was there, and
        monkeypatch.setenv(k, "")  # removes what apply_ray_env sets (a stack started by a later
        monkeypatch.delenv(k)  # test would read this test's token path otherwise)
    rc.apply_ray_env("127.0.0.1:6379")
    assert {k: os.environ[k] for k in auth} == auth
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/mine")
    monkeypatch.delenv("RAY_AUTH_MODE")
    rc.apply_ray_env("127.0.0.1:6379")
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == "/mine" and "RAY_AUTH_MODE" not in os.environ


def test_a_run_without_progress_says_what_it_waits_for_until_it_progresses():
    """Synchronised on the watch's own calls, not on sleeps: it speaks while nothing progresses,
    and its thread ends at the first progress (so it can say nothing more)."""
    said, spoke_twice, ended = [], threading.Event(), threading.Event()
    progressed = []

    def say(line: str) -> None:
        said.append(line)
        if len(said) >= 2:
            spoke_twice.set()

    def progress() -> bool:
        if progressed:
            ended.set()
        return bool(progressed)

    with rc.watch_start(lambda waited: f"waiting {waited:.1f}", progress, after=0.1, every=0.1,
                        say=say):
        assert spoke_twice.wait(30)
        assert said[0].startswith("waiting 0.")
        progressed.append(True)  # an epoch finished: the watch ends
        assert ended.wait(30)
        for t in watchers():
            t.join(30)
        assert not watchers()
        n = len(said)
    assert len(said) == n and n >= 2
    quiet = []
    with rc.watch_start(lambda w: "never", lambda: False, after=5, say=quiet.append):
        pass  # a run that ends before the minute says nothing
    for t in watchers():
        t.join(30)
    assert not watchers() and quiet == []


@pytest.mark.ray
def test_train_refuses_an_impossible_request_in_one_line(small_prepared, ray_head, mlflow_server,
                                                         tmp_path, capsys):
    from training.train import main

    code = main(["--data", str(small_prepared), "--model", "autorec", "--num-workers", "4",
                 "--cpus-per-worker", "2", "--runs-dir", str(tmp_path), "--run-name", "too-big",
                 "--mlflow-uri", mlflow_server.url, "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {IMPOSSIBLE}\n", err


@pytest.mark.ray
def test_the_stall_message_names_what_waits(ray_head):
    """A placement group the cluster cannot hold (4 CPUs on 3) is pending: the message says what
    the run asked for, what is free, and what waits."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 4}])
    try:
        deadline, line = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "waiting to be scheduled" not in line:
            line = rc.stall_message("run big", 4, 1, False, 61)
            time.sleep(1)
        assert line.startswith("run big: no epoch finished 61s after it started; it asks for 4 "
                               "worker(s) x 1 CPU plus 1 CPU for reading; the cluster has ")
        assert "of 3 CPUs free; waiting to be scheduled: 1 x {CPU: 4}" in line, line
        assert line.endswith("lower --num-workers or --cpus-per-worker, or add nodes")
    finally:
        remove_placement_group(pg)
    assert ray.is_initialized()


@pytest.mark.ray
def test_the_stall_message_says_a_placed_run_is_not_stalled(ray_head):
    """Nothing waits to be scheduled (a run whose workers are placed, on an epoch of minutes):
    the line says the workers run, not that other runs hold what it needs (which a healthy run
    at the Yahoo scale printed a minute into its first 3-minute epoch)."""
    deadline, line = time.monotonic() + 30, ""
    while time.monotonic() < deadline and "nothing waits" not in line:
        line = rc.stall_message("run small", 1, 1, False, 60)
        time.sleep(1)
    assert line.startswith("run small: no epoch finished 60s after it started; it asks for 1 "
                           "worker(s) x 1 CPU plus 1 CPU for reading; the cluster has "), line
    assert line.endswith("nothing waits to be scheduled, so its workers are running: a first "
                         "epoch this large can take longer (this line repeats until one "
                         "ends)"), line
    assert "other runs hold" not in line


def test_only_checkpoint_folders_are_counted_and_dropped(tmp_path):
    """Ray Train writes checkpoint_manager_snapshot.json beside its checkpoint_* folders: it is
    neither progress nor a checkpoint to delete (deleting it as a folder failed a finished run)."""
    run = tmp_path / "run"
    for name in ("checkpoint_2026-11-28_11-00-00.000000", "checkpoint_2026-11-28_11-01-00.000000"):
        (run / name).mkdir(parents=True)
        (run / name / "state.pt").write_bytes(b"x")
    for name in ("checkpoint_manager_snapshot.json", "model.pt", "run.json"):
        (run / name).write_text("{}")
    assert rc.checkpoints(str(run)) == {"checkpoint_2026-11-28_11-00-00.000000",
                                        "checkpoint_2026-11-28_11-01-00.000000"}
    assert rc.drop_checkpoints(str(run)) == 2
    assert sorted(p.name for p in run.iterdir()) == [
        "checkpoint_manager_snapshot.json", "model.pt", "run.json"]
    assert rc.checkpoints(str(run)) == set() and rc.drop_checkpoints(str(run)) == 0
    assert rc.checkpoints(str(tmp_path / "missing")) == set()


@pytest.mark.ray
def test_a_closed_form_fit_on_a_busy_cluster_says_what_it_waits_for(small_prepared, ray_head,
                                                                    monkeypatch, capsys):
    """Its Ray task waits for CPUs another job holds: the driver says so (it used to wait in
    silence), and the fit goes on once they are free."""
    import threading

    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from prepared.reader import open_prepared
    from training import closed_form
    from training.config import TrainConfig

    monkeypatch.setattr(rc, "STALL_SECONDS", 1.0)
    held = placement_group([{"CPU": ray.cluster_resources()["CPU"]}])  # every CPU: busy
    ray.get(held.ready(), timeout=60)
    cfg = TrainConfig(data=str(small_prepared), model="puresvd", rank=8, run_name="busy")
    done = {}
    fit = threading.Thread(target=lambda: done.update(
        out=closed_form.fit(cfg, open_prepared(str(small_prepared)), cpus=2)))
    fit.start()
    try:
        deadline, said = time.monotonic() + 60, ""
        while "not started" not in said and time.monotonic() < deadline:
            time.sleep(0.2)
            said += capsys.readouterr().out
    finally:
        remove_placement_group(held)
    fit.join(120)
    line = next(x for x in said.splitlines() if "not started" in x)
    assert line.startswith("run busy: not started ") and "after it was submitted; it asks for " \
        "2 CPU(s) in one task; the cluster has 0 of " in line
    assert done["out"][0]["best_valid_ndcg"] > 0.1  # then it ran


ORDER_PROBE = """
import sys
sys.path.insert(0, {root!r})
import runtime.raycluster as rc
import {module} as m

def apply_ray_env(address=None):
    # Ray reads RAY_AUTH_* when first imported: the settings must be in place before that
    print("ray imported before the env:", "ray" in sys.modules)
    raise SystemExit(0)

rc.apply_ray_env = apply_ray_env
{call}
"""


@pytest.mark.parametrize("module,call", [
    ("training.train", "m.start_ray(None, '127.0.0.1:6379')"),
    ("experiment.run", "m.connect(None, [], None, '127.0.0.1:6379')")])
def test_the_drivers_put_the_ray_env_in_place_before_importing_ray(module, call):
    """A driver that imported Ray before ``apply_ray_env`` could not join the stack's token-mode
    head (measured: ConnectionError after 30 s of InvalidAuthToken; with the env first it
    joins). Each driver's join calls ``apply_ray_env`` while Ray is not yet imported."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", ORDER_PROBE.format(root=root, module=module,
                                                                   call=call)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ray imported before the env: False" in out.stdout
