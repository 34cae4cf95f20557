"""Start, check and stop the local services on loopback: an MLflow tracking server (SQLite backend,
artifact root at an absolute path) and a Ray head with its job server.

Each service runs in its own process group (``start_new_session``), so ``stop`` ends it and every
process it spawned (MLflow's gunicorn/uvicorn workers; Ray's GCS, raylet, dashboard and workers)
with one signal, and leaves nothing behind. The Ray head runs with ``--block``: its processes are
children of the one we started, not daemons only ``ray stop`` could find.

A group of its own also outlives whoever started it. Services started for a process (``owner``:
a test session, the demo) get a watchdog (``infra.watchdog``) that stops them once that process
is gone, however it ended; services started for the user (``make stack``) run until ``make stop``.
"""

from __future__ import annotations

import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from runtime.raycluster import LOOPBACK_ENV, ray_env

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's console scripts: mlflow, ray, spark-submit
TOKEN_FILE = "ray_auth_token"


class ServiceError(RuntimeError):
    """A service did not come up; the message says why and where its log is."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    url: str       # what clients use: MLflow's tracking URI, Ray's dashboard / job server URL
    address: str   # Ray's GCS address (host:port); the URL again for MLflow
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # what a client needs (Ray's token auth)
    watchdog: int | None = None  # the pid of the watchdog stopping it with its owner, if any


# the kernel's own range for ports it picks (a bind to port 0, a client's connect)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def chosen_range() -> range | None:
    """Ports below the kernel's ephemeral range (22768-32767 under Linux's default 32768-60999),
    which the kernel never hands to a socket by itself; None where the range cannot be read.

    Why: a port we pick is released before the server we give it to binds it, and a Ray head
    starts a dozen processes that bind port 0 meanwhile; a port taken from the ephemeral range
    can be handed to one of them in that gap. Measured 2026-12-06: ``make stack`` failed after
    180 s because the dashboard agent's metrics port, free when chosen, was "already in use"
    (the raylet then exits waiting for the agent)."""
    try:
        lo, _ = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return None
    start = max(10_000, lo - 10_000)
    return range(start, lo) if lo - start >= 1_000 else None


def free_ports(n: int, avoid=()) -> list[int]:
    """``n`` distinct free loopback ports, none in ``avoid``, from ``chosen_range`` where there is
    one (in random order: two processes choosing at once rarely meet), else the kernel's choice.
    Each probe socket stays bound until all are chosen: ports picked one at a time and released
    at once can come back twice (the kernel may hand a just-freed ephemeral port out again), and
    Ray refuses to start when two of its components get the same port."""
    span = chosen_range()
    candidates = iter(random.sample(span, len(span)) if span else ())
    sockets, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            sockets.append(s)
            try:
                s.bind(("127.0.0.1", next(candidates, 0)))  # 0: the kernel's choice
            except OSError:  # in use (or not ours to bind): the next candidate
                continue
            port = s.getsockname()[1]
            if port not in avoid and port not in ports:
                ports.append(port)
    finally:
        for s in sockets:
            s.close()
    return ports


def free_port() -> int:
    return free_ports(1)[0]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port``: connections of a server that just stopped
    (TIME_WAIT) do not count, as servers bind with SO_REUSEADDR too."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _start(cmd: list[str], log: Path, health_url: str, timeout: float,
           env: dict | None = None, owner: int | None = None) -> tuple[subprocess.Popen, int | None]:
    """Run ``cmd`` in its own process group, logging to ``log``, and wait until ``health_url``
    answers; on failure nothing is left running. With an ``owner`` pid, a watchdog stops the
    group when that process is gone (started at once: the owner may die while we wait here);
    returns the process and the watchdog's pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})
    dog = watch(owner, [proc.pid], log) if owner else None  # a new session: pgid == pid
    try:
        wait_http(health_url, proc, log, timeout)
    except ServiceError:
        stop(proc)
        raise
    return proc, dog


def watch(owner: int, pgids: list[int], log: Path) -> int:
    """Start a watchdog (``python -m infra.watchdog``) that stops the process groups ``pgids``
    once ``owner`` is gone; returns its pid. It runs in a session of its own, so a signal to the
    owner's group (a timeout's, Ctrl-C) does not take it along; it logs to ``log``."""
    with open(log, "ab") as f:
        dog = subprocess.Popen([sys.executable, "-m", "infra.watchdog", "--owner", str(owner),
                                *[a for g in pgids for a in ("--pgid", str(g))]],
                               cwd=ROOT, stdin=subprocess.DEVNULL, stdout=f,
                               stderr=subprocess.STDOUT, start_new_session=True)
    return dog.pid


def release(watchdog: int | None) -> None:
    """Dismiss a watchdog (SIGUSR1): its services keep running after their owner ends."""
    if not watchdog:
        return
    try:
        os.kill(watchdog, signal.SIGUSR1)
    except ProcessLookupError:
        pass
    _reap(watchdog)


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll ``url`` until it answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{url}: the server exited with code {proc.returncode}; see {log}:\n"
                               + tail(log))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if e.code == 401:  # Ray's token authentication: the server is up and answering
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise ServiceError(f"{url} did not answer within {timeout:.0f}s; see {log}:\n" + tail(log))


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def check_port(port: int, what: str) -> None:
    if not port_is_free(port):
        raise ServiceError(f"port {port} on 127.0.0.1 is taken (wanted for {what}); stop what "
                           "uses it or pick another port")


def start_mlflow(state: Path, port: int, timeout: float = 120.0,
                 owner: int | None = None) -> Service:
    """``mlflow server`` with ``sqlite:///STATE/mlflow.db`` and artifacts in STATE/artifacts;
    stopped by a watchdog when the process ``owner`` is gone, if given."""
    state = state.resolve()
    check_port(port, "the MLflow server")
    (state / "artifacts").mkdir(parents=True, exist_ok=True)
    log = state / "mlflow-server.log"
    cmd = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{state / 'mlflow.db'}",
           "--default-artifact-root", str(state / "artifacts"), "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    # MLflow 3's server also starts a job runner (five huey consumers, ~250 MB each, polling) for
    # its GenAI jobs, which tracking runs and the model registry never use; on a 2-core machine
    # they took CPU from every test and demo beside them. A user may turn it back on.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION":
           os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")}
    proc, dog = _start(cmd, log, url + "/health", timeout, env=env, owner=owner)
    return Service("mlflow", proc, url, url, log, watchdog=dog)


def ray_side_ports(head: bool = True, avoid=()) -> list[str]:
    """Flags giving a Ray node's auxiliary servers distinct free ports on loopback, none of
    ``avoid`` (the node's own GCS and dashboard ports)."""
    flags = (["--ray-client-server-port"] if head else []) + [
        "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
        "--runtime-env-agent-port"]
    return [x for flag, port in zip(flags, free_ports(len(flags), avoid)) for x in (flag, str(port))]


def ray_token(folder: Path) -> dict[str, str]:
    """The environment that puts a Ray head and its clients in token-authentication mode with one
    token, provisioned here rather than left to whatever a home directory holds.

    Ray 2.60's ``ray start --head`` refuses to start in token mode without a token and never
    creates one (only a local ``ray.init()`` does, in ``~/.ray``), so a fresh machine fails where
    an old one passes. A token the user already gives (``RAY_AUTH_TOKEN``, or a file named by
    ``RAY_AUTH_TOKEN_PATH``) is used as it is; otherwise ``folder/ray_auth_token`` (mode 0600,
    under the git-ignored ``var/``) is created once and reused.
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"]}
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if given:
        if not Path(given).is_file() or not Path(given).read_text().strip():
            raise ServiceError(f"RAY_AUTH_TOKEN_PATH={given} names no token file; create one "
                               f"(python -c 'import secrets; print(secrets.token_hex(32))' > {given}; "
                               f"chmod 600 {given}) or unset it to let the stack make its own")
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(Path(given).resolve())}
    path = folder.resolve() / TOKEN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: two starts racing make one token, not two; 0600 from birth, never readable
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes
    except FileExistsError:
        pass
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def start_ray_head(temp_dir: Path, port: int, dashboard_port: int, num_cpus: int,
                   auth: dict[str, str], timeout: float = 180.0,
                   owner: int | None = None) -> Service:
    """A Ray head on 127.0.0.1 with the dashboard (the job server) on ``dashboard_port``, in
    token-authentication mode with the token of ``auth`` (from ``ray_token``); stopped by a
    watchdog when the process ``owner`` is gone, if given.

    ``num_cpus`` may exceed the real cores: Ray Data needs a logical CPU beside the training
    workers' (platform.md), and the workers' torch threads are set from their own share.
    """
    check_port(port, "the Ray head (GCS)")
    check_port(dashboard_port, "the Ray dashboard / job server")
    temp_dir = temp_dir.resolve()
    log = temp_dir.parent / f"{temp_dir.name}-head.log"
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(port), "--dashboard-host", "127.0.0.1", "--dashboard-port",
           str(dashboard_port), "--num-cpus", str(num_cpus), "--temp-dir", str(temp_dir),
           # every port free, not Ray's defaults: a second Ray on this machine (a test's, a
           # user's) would otherwise take the agent's port and the job server would never get one
           *ray_side_ports(avoid=(port, dashboard_port)),
           "--include-dashboard", "true", "--disable-usage-stats"]
    # the job server runs `python ...` entry points: this venv's python first on PATH; the jobs'
    # drivers inherit the head's token settings and the project's Ray settings (ray_env); the
    # head stays on loopback (LOOPBACK_ENV, which its clients need too: recorded with the token)
    auth = {**auth, **LOOPBACK_ENV}
    env = {**auth, **ray_env(), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    url = f"http://127.0.0.1:{dashboard_port}"
    proc, dog = _start(cmd, log, url + "/api/version", timeout, env, owner)
    try:
        wait_job_agent(f"127.0.0.1:{port}", auth, timeout)
    except ServiceError as e:
        stop(proc, timeout=5)
        raise ServiceError(f"{e}; see {log}") from None
    return Service("ray", proc, url, f"127.0.0.1:{port}", log, dict(auth), dog)


_AGENT_PROBE = """
import sys, time
from ray._raylet import GcsClient
gcs, deadline = GcsClient(address=sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    if gcs.internal_kv_keys(b"DASHBOARD_AGENT_ADDR_NODE_ID_PREFIX:", namespace=b"dashboard"):
        sys.exit(0)
    time.sleep(0.5)
sys.exit(1)
"""


def wait_job_agent(gcs_address: str, auth: dict[str, str], timeout: float) -> None:
    """Wait until the head's dashboard agent has registered: the job server answers before it,
    and a job submitted in between fails with "No available agent to submit job" (the server
    waits only 10 s for the agent; on a busy 2-core machine it takes longer)."""
    out = subprocess.run([sys.executable, "-c", _AGENT_PROBE, gcs_address, str(timeout)],
                         env={**os.environ, **auth}, capture_output=True,
                         text=True, timeout=timeout + 60)
    if out.returncode != 0:
        raise ServiceError(f"the Ray head at {gcs_address} started, but its job agent did not "
                           f"register within {timeout:.0f}s (its log, dashboard_agent.log in the "
                           f"head's session logs, says why) {out.stderr.strip()[-300:]}")


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop the service ``proc`` leads (its whole process group): see ``stop_group``.

    A Ray head takes about 30 s to wind down gracefully on 2 cores; its callers pass a short
    timeout (what is lost is the session's scratch state, not data: checkpoints and MLflow live
    elsewhere)."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    stop_group(pgid, timeout)
    proc.poll()


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group ``pgid`` (its leader's pid), SIGKILL what is left after
    ``timeout``. Works from any process: ``infra.stack`` stops groups started by an earlier one."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pgid)
            if not group_alive(pgid):
                return
            time.sleep(0.2)


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is this process's own child: an unreaped zombie would
    keep its process group looking alive."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # started by another process (the usual case): init reaps it
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
