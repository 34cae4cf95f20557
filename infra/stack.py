"""The local stack on loopback: an MLflow tracking server and a Ray head with its job server.

    python -m infra.stack start     # start both (reuses what is already running and healthy)
    python -m infra.stack status    # what runs where; exit 1 if something is down
    python -m infra.stack stop      # stop both; nothing is left running

MLflow's settings (port, SQLite file, artifact root) are in ``mlflow/server.json``; its state lives
under ``mlflow/state/`` (git-ignored). The Ray head's ports and logical CPUs are flags. What runs is
recorded in ``var/stack/stack.json`` (process groups, URLs), so ``stop`` and ``status`` work from
any later shell, and a second ``start`` reuses a healthy stack instead of starting another.

A stack started from the command line is yours: it runs until ``stop``. One that the demo or the
test session starts for itself is stopped when that program ends, however it ends.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra import services
from infra.watchdog import start_time, stop_groups
from runtime.atomic import write_text
from runtime.cli import strict_parser

ROOT = Path(__file__).resolve().parents[1]
MLFLOW_CONFIG = ROOT / "mlflow" / "server.json"
STATE = ROOT / "var" / "stack"


@dataclass
class Running:
    name: str
    pgid: int
    url: str        # MLflow's tracking URI; Ray's dashboard / job server
    address: str    # Ray's GCS address; MLflow's URL again
    log: str
    # what a client needs in its environment (Ray's token mode and token file, and for a head on
    # loopback raycluster.LOOPBACK_ENV; an inline RAY_AUTH_TOKEN of the user's environment is not
    # written here)
    env: dict[str, str] = field(default_factory=dict)
    owner: int | None = None     # the pid it stops with (its watchdog's); None: the user's
    watchdog: int | None = None
    # the group leader's start time (infra.watchdog.start_time): after a reboot or once the pid
    # is reused, the recorded group id can lead a stranger's processes, which a stop must spare
    born: str | None = None


def stranger(svc: Running) -> str | None:
    """What leads ``svc``'s recorded process group now, if it is not the process this stack
    started (None: it is, or the leader is gone and what is left of the group is its own: the
    kernel never reuses the id of a group that still has members)."""
    now = start_time(svc.pgid)
    if svc.born is None or now is None or now == svc.born:
        return None
    return (f"process group {svc.pgid} is led by a process started at {now} clock ticks after "
            f"boot, not the recorded {svc.born}: another program's (after a reboot or a reused "
            "pid), left alone")


def stop_service(name: str, svc: Running, timeout: float, log) -> bool:
    """Stop ``svc``'s process group unless a stranger leads it now (then say so); returns
    whether it was signalled."""
    problem = stranger(svc)
    if problem:
        log(f"{name}: not stopped: {problem}; its record is dropped")
        return False
    services.stop_group(svc.pgid, timeout)
    return True


def client_env(record: dict[str, Running]) -> dict[str, str]:
    """The variables a client of this stack needs (``ray job submit``, ``ray.init``, the Ray jobs'
    own Spark and MLflow calls need none): Ray's token mode and where its token is."""
    if "ray" not in record:
        return {}
    env = dict(record["ray"].env) or {"RAY_AUTH_MODE": "token"}  # a record of an older version
    if env and "RAY_AUTH_TOKEN_PATH" not in env and os.environ.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_TOKEN"] = os.environ["RAY_AUTH_TOKEN"]
    return env


def mlflow_settings(path: Path = MLFLOW_CONFIG) -> dict:
    """``mlflow/server.json`` with its paths made absolute (relative ones are to ``mlflow/``)."""
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise services.ServiceError(f"{path}: cannot read the MLflow server settings ({e})") from None
    for key in ("state_dir",):
        p = Path(cfg[key])
        cfg[key] = str(p if p.is_absolute() else (path.parent / p).resolve())
    return cfg


def _record_path(state: Path) -> Path:
    return state / "stack.json"


def read_record(state: Path = STATE) -> dict[str, Running]:
    try:
        raw = json.loads(_record_path(state).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: Running(**v) for k, v in raw.items()}


def write_record(services_: dict[str, Running], state: Path = STATE) -> None:
    state.mkdir(parents=True, exist_ok=True)
    # atomic: a reader sees the old record or the new one
    write_text(_record_path(state), json.dumps({k: asdict(v) for k, v in services_.items()},
                                               indent=2))


def healthy(svc: Running) -> bool:
    """The process group exists and the service answers over HTTP."""
    if not services.group_alive(svc.pgid):
        return False
    url = svc.url + ("/health" if svc.name == "mlflow" else "/api/version")
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except urllib.error.HTTPError as e:
        return e.code == 401  # Ray's token authentication: up and answering
    except OSError:
        return False


def ray_temp_dir(state: Path) -> Path:
    """Ray's session directory for the stack recorded in ``state``: short (Ray's unix sockets live
    under it and their paths must stay under ~107 characters) and distinct per stack."""
    tag = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"nce-ray-{os.getuid()}-{tag}"


def start(*, ray_port: int = 6379, dashboard_port: int = 8265, num_cpus: int | None = None,
          state: Path = STATE, mlflow_config: Path = MLFLOW_CONFIG, log=print,
          owner: int | None = None) -> dict[str, Running]:
    """Start whatever of the stack is not already running and healthy; returns both.

    A start that fails part-way stops what this call started (a service that was already running
    is left alone) and records only what still runs. With ``owner`` (a pid), what this call
    starts is stopped by a watchdog once that process is gone; a service that was running
    already keeps its own terms."""
    record = read_record(state)
    for name, svc in list(record.items()):
        if healthy(svc):
            log(f"{name}: already running at {svc.url} (process group {svc.pgid}); reusing it")
        else:
            log(f"{name}: recorded at {svc.url} but not answering; restarting it")
            stop_service(name, svc, 5, log)
            del record[name]
    write_record(record, state)
    started: list[str] = []
    try:
        if "mlflow" not in record:
            cfg = mlflow_settings(mlflow_config)
            log(f"mlflow: starting on 127.0.0.1:{cfg['port']} (state in {cfg['state_dir']}) ...")
            svc = services.start_mlflow(Path(cfg["state_dir"]), int(cfg["port"]), owner=owner)
            record["mlflow"] = Running("mlflow", os.getpgid(svc.proc.pid), svc.url, svc.address,
                                       str(svc.log), owner=owner, watchdog=svc.watchdog,
                                       born=start_time(svc.proc.pid))
            started.append("mlflow")
            write_record(record, state)
            log(f"mlflow: up at {svc.url}")
        if "ray" not in record:
            cpus = num_cpus or max(3, (os.cpu_count() or 1) + 1)  # +1: Ray Data beside 2 workers
            auth = services.ray_token(state)
            log(f"ray: starting a head on 127.0.0.1:{ray_port}, job server on :{dashboard_port}, "
                f"{cpus} logical CPUs, token authentication "
                f"({auth.get('RAY_AUTH_TOKEN_PATH', 'RAY_AUTH_TOKEN of this environment')}) ...")
            svc = services.start_ray_head(ray_temp_dir(state), ray_port, dashboard_port, cpus, auth,
                                          owner=owner)
            record["ray"] = Running("ray", os.getpgid(svc.proc.pid), svc.url, svc.address,
                                    str(svc.log), {k: v for k, v in svc.env.items()  # + loopback
                                                   if k != "RAY_AUTH_TOKEN"}, owner, svc.watchdog,
                                    start_time(svc.proc.pid))
            started.append("ray")
            write_record(record, state)
            log(f"ray: up at {svc.url} (GCS {svc.address})")
    except BaseException:
        for name in started:  # nothing this call started is left running after it failed
            services.stop_group(record.pop(name).pgid, 5)
            log(f"{name}: stopped again, as the start failed")
        if record:
            write_record(record, state)
        else:
            _record_path(state).unlink(missing_ok=True)
        raise
    return record


def stop(state: Path = STATE, log=print, owner: int | None = None,
         grace: float | None = None) -> None:
    """Stop the recorded services; with ``owner``, only those started for that process (a
    demo stopping on SIGTERM leaves the user's own stack it reused alone). ``grace``: SIGTERM
    them all at once and SIGKILL what is left that many seconds later (a process told to stop
    has seconds, not the half minute a graceful Ray head takes)."""

    record = read_record(state)
    if not record:
        log("nothing recorded as running (no var/stack/stack.json)")
    mine = {k: v for k, v in record.items() if owner is None or v.owner == owner}
    if grace is not None:
        stop_groups([svc.pgid for svc in mine.values() if not stranger(svc)], grace,
                    log=lambda s: None)
    for name, svc in mine.items():
        if stop_service(name, svc, 5 if name == "ray" else 10, log):
            log(f"{name}: stopped (process group {svc.pgid})")
    rest = {k: v for k, v in record.items() if k not in mine}
    if rest:
        write_record(rest, state)
    else:
        _record_path(state).unlink(missing_ok=True)


def release(state: Path = STATE, owner: int | None = None) -> list[str]:
    """Hand the services started for ``owner`` over to the user: their watchdogs are dismissed
    and they run until ``stop`` (the demo leaves its stack up for the MLflow UI); returns them."""
    record = read_record(state)
    names = [k for k, v in record.items() if v.owner is not None and v.owner == owner]
    for name in names:
        services.release(record[name].watchdog)
        record[name].owner = record[name].watchdog = None
    if names:
        write_record(record, state)
    return names


def status(state: Path = STATE, log=print) -> bool:
    record = read_record(state)
    ok = bool(record)
    for name in ("mlflow", "ray"):
        svc = record.get(name)
        up = svc is not None and healthy(svc)
        ok &= up
        gcs = f" (GCS {svc.address}: a driver's --ray-address)" if name == "ray" and svc else ""
        log(f"{name}: " + (f"up at {svc.url}{gcs}" if up else
                           f"DOWN (recorded at {svc.url})" if svc else "not started"))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = strict_parser(prog="python -m infra.stack", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("command", choices=["start", "status", "stop"],
                   help="start both (reusing what runs and is healthy), show what runs, or stop both")
    p.add_argument("--ray-port", type=int, default=6379, help="Ray GCS port (default 6379)")
    p.add_argument("--dashboard-port", type=int, default=8265,
                   help="Ray dashboard and job server port (default 8265)")
    p.add_argument("--num-cpus", type=int, default=None,
                   help="logical CPUs of the Ray head (default: cores + 1, at least 3)")
    p.add_argument("--state", type=Path, default=STATE,
                   help="where the record of what runs and the Ray token live (default var/stack)")
    p.add_argument("--mlflow-config", type=Path, default=MLFLOW_CONFIG,
                   help="the MLflow server's settings (default mlflow/server.json)")
    args = p.parse_args(argv)
    try:
        if args.command == "start":
            record = start(ray_port=args.ray_port, dashboard_port=args.dashboard_port,
                           num_cpus=args.num_cpus, state=args.state, mlflow_config=args.mlflow_config)
            exports = {"MLFLOW_TRACKING_URI": record["mlflow"].url, "RAY_ADDRESS": record["ray"].url,
                       **{k: v for k, v in client_env(record).items() if k != "RAY_AUTH_TOKEN"}}
            print("\nTo use the stack from another shell:\n"
                  + "".join(f"export {k}={v}\n" for k, v in exports.items())
                  + f"(RAY_ADDRESS is the job server, for `ray job submit`; a driver run directly, "
                  f"python training/train.py, joins with --ray-address {record['ray'].address})\n"
                  + f"MLflow UI: {record['mlflow'].url}    Ray dashboard: {record['ray'].url}\n"
                  "stop with: python -m infra.stack stop")
        elif args.command == "stop":
            stop(args.state)
        else:
            return 0 if status(args.state) else 1
    except services.ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        if read_record(args.state):
            print("the services that were running before are still running: "
                  "python -m infra.stack status / stop", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
