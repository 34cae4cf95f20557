"""The local stack script (``infra.stack``) on the session's real stack: a second start reuses it,
status sees it, a taken port is refused with a clear message. (Stopping it leaving nothing behind
is asserted when the session's ``local_stack`` fixture ends.)"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys

import pytest

from infra import services, stack

ROOT = stack.ROOT

pytestmark = pytest.mark.ray


def test_second_start_reuses_the_running_stack(local_stack):
    said = []
    again = stack.start(state=local_stack.state, mlflow_config=local_stack.mlflow_config,
                        log=said.append)
    assert {k: v.pgid for k, v in again.items()} == \
        {k: v.pgid for k, v in local_stack.services.items()}
    assert len(said) == 2 and all("already running" in s and "reusing" in s for s in said)
    from infra.watchdog import start_time

    # each record knows its group leader by its start time, which a stop checks first
    assert all(v.born is not None and v.born == start_time(v.pgid) for v in again.values())
    lines = []
    assert stack.status(local_stack.state, log=lines.append)
    assert sorted(lines) == sorted(f"{k}: up at {v.url}" + (f" (GCS {v.address}: a driver's "
                                   "--ray-address)" if k == "ray" else "")
                                   for k, v in local_stack.services.items())


def environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def group_commands(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "args=", "-g", str(pgid)], capture_output=True, text=True)
    return out.stdout.splitlines()


def test_the_stack_runs_without_what_it_does_not_use(local_stack):
    """MLflow's GenAI job runner (five huey consumers a server) stays off, and the Ray head and
    its jobs get the project's Ray settings (two Parquet footer readers, not 32 processes)."""
    mlflow, ray = local_stack.services["mlflow"], local_stack.services["ray"]
    assert environ(mlflow.pgid)["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert not [c for c in group_commands(mlflow.pgid) if "huey" in c]
    assert len(group_commands(mlflow.pgid)) >= 2  # the server and its uvicorn: the group is seen
    assert environ(ray.pgid)["RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"] == "2"
    assert environ(ray.pgid)["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.25"


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F",  # 127.0.0.1, IPv4 or mapped IPv6
            "00000000000000000000000001000000"}  # ::1


def listening(pgids: set[int]) -> dict[str, set[str]]:
    """Every TCP socket listening in a process of the groups ``pgids`` (a Ray head's raylet
    starts its workers in its group): program name -> the local addresses (hex, as
    /proc/net/tcp{,6} writes them, with the port)."""
    inodes: dict[str, str] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) not in pgids:
                continue
            name = open(f"/proc/{pid}/comm").read().strip()
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = name
        except OSError:  # gone meanwhile
            continue
    found: dict[str, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.setdefault(inodes[fields[9]], set()).add(fields[1])
    return found


def test_the_stack_listens_on_loopback_only(local_stack, ray_head):
    """Every listening socket of the stack's processes (MLflow, the Ray head's GCS, raylet,
    dashboard and agents, and the Ray workers) is on 127.0.0.1: Ray's own default left its gRPC
    servers on every interface (runtime.raycluster.LOOPBACK_ENV)."""
    import ray

    assert ray.get(ray.remote(lambda: 1).remote()) == 1  # a worker is up, listening too
    groups = {svc.pgid for svc in local_stack.services.values()}
    found = listening(groups)
    assert {"gcs_server", "raylet"} <= set(found) and len(found) >= 4, found
    outside = {name: {a for a in addrs if a.rsplit(":", 1)[0] not in LOOPBACK}
               for name, addrs in found.items()}
    assert not any(outside.values()), outside
    assert environ(local_stack.services["ray"].pgid)["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_the_users_own_ray_settings_win(monkeypatch):
    from runtime import raycluster

    monkeypatch.delenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", raising=False)
    monkeypatch.delenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", raising=False)
    assert raycluster.ray_env() == {"RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "2",
                                    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25"}
    monkeypatch.setenv("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "16")
    raycluster.apply_ray_env()
    assert os.environ["RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"] == "16"


def test_a_one_node_cluster_runs_no_preemption_watcher_unless_the_user_asks(monkeypatch):
    from runtime import raycluster

    monkeypatch.delenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", raising=False)
    raycluster.apply_one_node_env(3)  # several nodes: a drained one is worth watching for
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in os.environ
    raycluster.apply_one_node_env(1)
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")
    raycluster.apply_one_node_env(1)
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"


def test_a_taken_port_is_refused_with_the_port_and_the_fix(local_stack, tmp_path):
    port = int(local_stack.services["mlflow"].url.rsplit(":", 1)[1])
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"port": port, "state_dir": str(tmp_path / "m")}))
    with pytest.raises(services.ServiceError,
                       match=rf"port {port} on 127.0.0.1 is taken \(wanted for the MLflow server\); "
                             "stop what uses it or pick another port"):
        stack.start(state=tmp_path / "state", mlflow_config=config, log=lambda s: None)
    assert not stack.read_record(tmp_path / "state")  # nothing recorded, nothing started


def test_status_of_a_dead_stack_says_down(tmp_path):
    with socket.socket() as s:  # a recorded service whose process group is gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stack.write_record({"mlflow": stack.Running("mlflow", 2**22 + 12345, f"http://127.0.0.1:{port}",
                                                "", "")}, tmp_path)
    lines = []
    assert not stack.status(tmp_path, log=lines.append)
    assert lines == [f"mlflow: DOWN (recorded at http://127.0.0.1:{port})", "ray: not started"]


def test_a_stop_spares_a_stranger_under_a_recorded_process_group(tmp_path):
    """After a reboot or a reused pid, the recorded group id can lead another program: its leader
    started at another time than the recorded one, so neither `make stop` (nor a demo's stop
    with a grace) signals it; the record with the service's own start time stops it."""
    from infra.watchdog import start_time

    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own process group
    try:
        born = start_time(other.pid)
        record = lambda b: {"mlflow": stack.Running("mlflow", other.pid, "http://127.0.0.1:9", "",
                                                    "", born=b)}
        lines = []
        for grace in (None, 1.0):
            stack.write_record(record("12345"), tmp_path)
            stack.stop(tmp_path, log=lines.append, grace=grace)
            assert other.poll() is None  # still running
            assert lines.pop() == (
                f"mlflow: not stopped: process group {other.pid} is led by a process started "
                f"at {born} clock ticks after boot, not the recorded 12345: another program's "
                "(after a reboot or a reused pid), left alone; its record is dropped")
            assert stack.read_record(tmp_path) == {}
        stack.write_record(record(born), tmp_path)
        stack.stop(tmp_path, log=lines.append)
        assert other.wait(10) is not None and lines == [f"mlflow: stopped (process group {other.pid})"]
    finally:
        other.kill()
        other.wait()


def test_bad_mlflow_settings_name_the_file(tmp_path):
    bad = tmp_path / "server.json"
    bad.write_text("{port: 5000")
    with pytest.raises(services.ServiceError, match=rf"{bad}: cannot read the MLflow server settings"):
        stack.mlflow_settings(bad)


def test_the_stack_starts_on_a_fresh_machine_with_an_empty_home(tmp_path):
    """What a newcomer has: no ~/.ray, no RAY_* / MLFLOW_* variables. The stack provisions its own
    Ray token (0600, under its state), and a client in another shell needs only what `start`
    prints to submit a job; nothing is written into the home directory."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env["HOME"] = str(home)
    state, config = tmp_path / "state", tmp_path / "server.json"
    mlflow_port, ray_port, dashboard_port = services.free_ports(3)
    config.write_text(json.dumps({"port": mlflow_port, "state_dir": str(tmp_path / "m")}))
    cli = [sys.executable, "-m", "infra.stack"]
    where = ["--state", str(state), "--mlflow-config", str(config)]
    try:
        out = subprocess.run([*cli, "start", *where, "--ray-port", str(ray_port),
                              "--dashboard-port", str(dashboard_port), "--num-cpus", "1"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert out.returncode == 0, out.stdout + out.stderr
        token = state / services.TOKEN_FILE
        assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
        exports = dict(re.findall(r"^export (\w+)=(\S+)$", out.stdout, re.M))
        assert exports["RAY_AUTH_TOKEN_PATH"] == str(token) and exports["RAY_AUTH_MODE"] == "token"
        assert exports["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # a driver joins on loopback
        assert re.search(r"joins with --ray-address 127\.0\.0\.1:\d+\)$", out.stdout, re.M)
        assert subprocess.run([*cli, "status", *where], cwd=ROOT, env=env).returncode == 0
        # the user's stack: no owner and no watchdog, it runs until `stop`
        assert all(s.owner is None and s.watchdog is None for s in stack.read_record(state).values())

        client = {**env, **exports}  # "another shell" that exported what start printed
        job = subprocess.run(
            [str(services.BIN / "ray"), "job", "submit", "--address", exports["RAY_ADDRESS"], "--",
             "python", "-c", "import ray; ray.init(); print('CPUS', ray.cluster_resources()['CPU'])"],
            cwd=tmp_path, env=client, capture_output=True, text=True, timeout=300)
        assert job.returncode == 0 and "CPUS 1.0" in job.stdout, job.stdout[-2000:] + job.stderr
        denied = subprocess.run(  # without the token the job server refuses the client
            [str(services.BIN / "ray"), "job", "list", "--address", exports["RAY_ADDRESS"]],
            cwd=tmp_path, env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True,
            timeout=120)
        assert denied.returncode != 0
    finally:
        subprocess.run([*cli, "stop", *where], cwd=ROOT, env=env, timeout=120)
    assert not [p.name for p in home.iterdir() if p.name == ".ray"]
    assert not stack.read_record(state)


def test_a_start_that_fails_part_way_stops_what_it_started(tmp_path):
    port = services.free_port()
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"port": port, "state_dir": str(tmp_path / "m")}))
    said = []
    with socket.socket() as taken:  # the Ray head's port is in use: MLflow starts, Ray cannot
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(services.ServiceError, match="wanted for the Ray head"):
            stack.start(ray_port=taken.getsockname()[1], dashboard_port=services.free_port(),
                        state=tmp_path / "state", mlflow_config=config, log=said.append)
    assert f"mlflow: up at http://127.0.0.1:{port}" in said  # it did start ...
    assert said[-1] == "mlflow: stopped again, as the start failed"  # ... and was stopped
    assert services.port_is_free(port) and not stack.read_record(tmp_path / "state")
