"""Static checks of the cluster configurations under infra/cluster: the manifests parse, name the
project's entry points, and every command line in them is accepted by that entry point's own
argument parser (a renamed flag fails here, not on a cluster). Authentication is checked the same
way: every Ray node runs with token auth and a token source, no file holds a token, and the MLflow
server script (run against a fake `mlflow`) binds loopback or runs the basic-auth app."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "infra" / "cluster"


def parse_train_command(command: str) -> None:
    from training.train import build_parser

    argv = shlex.split(command)
    assert argv[:2] == ["python", "training/train.py"], argv[:2]
    build_parser().parse_args(argv[2:])  # exits (SystemExit) on an unknown or bad flag


def test_rayjob_runs_training_with_valid_flags_on_a_gpu_worker_group():
    job = yaml.safe_load((CLUSTER / "kuberay-rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    parse_train_command(job["spec"]["entrypoint"])
    assert "--use-gpu" in job["spec"]["entrypoint"]
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    gpus = workers[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= 1


def test_raycluster_and_ray_up_files_describe_a_head_and_workers():
    rc = yaml.safe_load((CLUSTER / "kuberay-raycluster.yaml").read_text())
    assert rc["kind"] == "RayCluster" and rc["spec"]["headGroupSpec"] and rc["spec"]["workerGroupSpecs"]
    up = yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())
    assert up["head_node_type"] in up["available_node_types"]
    assert any("ray start --head" in c for c in up["head_start_ray_commands"])
    # the documented submit commands in the headers parse as training commands
    for name in ("ray-cluster.yaml", "kuberay-raycluster.yaml"):
        text = (CLUSTER / name).read_text()
        lines = [ln.lstrip("# ").rstrip("\\").strip() for ln in text.splitlines() if ln.startswith("#")]
        joined = " ".join(lines)
        command = joined.split("-- ", 1)[1].split("#")[0]
        command = command[:command.index("--run-name")] + "--run-name x"
        parse_train_command(command)


def mlflow_container() -> dict:
    docs = list(yaml.safe_load_all((CLUSTER / "mlflow-k8s.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    return docs[0]["spec"]["template"]["spec"]["containers"][0]


def test_mlflow_manifest_runs_the_server_script_with_basic_auth_from_a_secret():
    container = mlflow_container()
    assert container["command"][-1] == "infra/cluster/mlflow-server.sh"
    assert "--backend-store-uri" in (CLUSTER / "mlflow-server.sh").read_text()
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_AUTH"]["value"] == "basic"
    for name in ("MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_DB"):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"], name


@pytest.mark.parametrize("script", ["spark-submit.sh", "mlflow-server.sh"])
def test_shell_scripts_are_valid_bash(script):
    subprocess.run(["bash", "-n", str(CLUSTER / script)], check=True)


def test_spark_script_refuses_other_entry_points_and_its_examples_parse():
    out = subprocess.run(["bash", str(CLUSTER / "spark-submit.sh"), "standalone", "training/train.py"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "SCRIPT must be etl/prepare.py" in out.stderr
    from etl.prepare import build_parser as etl_parser
    from evaluation.evaluate import build_parser as evaluate_parser
    from evaluation.score import build_parser as score_parser

    parsers = {"etl/prepare.py": etl_parser(), "evaluation/score.py": score_parser(),
               "evaluation/evaluate.py": evaluate_parser()}
    text = (CLUSTER / "spark-submit.sh").read_text().split("# Environment:")[0]
    examples = " ".join(ln.lstrip("#").strip().rstrip("\\") for ln in text.splitlines()[1:])
    seen = set()
    for part in examples.split("infra/cluster/spark-submit.sh")[1:]:
        argv = shlex.split(part)
        assert argv[0] in ("standalone", "k8s")
        parsers[argv[1]].parse_args(argv[2:])
        seen.add(argv[1])
    assert seen == set(parsers)


def test_dockerfile_installs_the_project_and_java():
    text = (CLUSTER / "Dockerfile").read_text()
    assert "openjdk-17" in text and "pip install" in text and "-e ." in text
    import tomllib

    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for pkg in {p.split(".")[0] for p in packages}:  # every top-level folder (with its subpackages)
        assert f"COPY --chown=ray {pkg} {pkg}" in text



def test_every_subpackage_is_installed():
    """setuptools' explicit ``packages`` list takes no subpackage by itself: a wheel (not the
    editable install) would miss e.g. models/autorec and fail on import."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(init.parent.relative_to(ROOT)).replace("/", ".")
             for top in {p.split(".")[0] for p in listed} for init in (ROOT / top).rglob("__init__.py")}
    assert found == listed


# --- authentication -------------------------------------------------------------------------------

TOKEN_FILE_HEX = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")  # secrets.token_hex(32)


def assignments(command: str) -> dict[str, str]:
    """The VAR=value words in front of a shell command."""
    env = {}
    for word in shlex.split(command):
        name, eq, value = word.partition("=")
        if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            break
        env[name] = value
    return env


def test_ray_up_nodes_run_with_token_auth_from_a_file_that_file_mounts_syncs():
    up = yaml.safe_load((CLUSTER / "ray-cluster.yaml").read_text())
    mounts = up["file_mounts"]

    def synced(path: str) -> bool:
        return any(path == remote or path.startswith(remote.rstrip("/") + "/") for remote in mounts)

    for local in mounts.values():  # the token stays outside the repository
        assert local.startswith(("~", "/")) and not Path(local).expanduser().is_relative_to(ROOT), local
    starts = {key: [c for c in up[key] if "ray start" in c]
              for key in ("head_start_ray_commands", "worker_start_ray_commands")}
    assert all(starts.values()), starts
    for command in sum(starts.values(), []):
        env = assignments(command)
        assert env.get("RAY_AUTH_MODE") == "token", command
        assert "RAY_AUTH_TOKEN" not in env and synced(env["RAY_AUTH_TOKEN_PATH"]), command
    # the container's own environment too, for every process started in it
    options = " ".join(up["docker"]["run_options"]).split()
    docker_env = dict(options[i + 1].split("=", 1) for i, o in enumerate(options) if o in ("--env", "-e"))
    assert docker_env.get("RAY_AUTH_MODE") == "token" and synced(docker_env["RAY_AUTH_TOKEN_PATH"])
    # the job server only on the head's loopback (clients come through `ray dashboard`'s ssh tunnel)
    head = " ".join(starts["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    header = (CLUSTER / "ray-cluster.yaml").read_text().split("\ncluster_name:")[0]
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=" in header and "ray dashboard" in header


def ray_cluster_spec(name: str) -> dict:
    doc = yaml.safe_load((CLUSTER / name).read_text())
    return doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]


@pytest.mark.parametrize("name", ["kuberay-raycluster.yaml", "kuberay-rayjob.yaml"])
def test_kuberay_ray_containers_run_with_token_auth_from_a_secret(name):
    spec = ray_cluster_spec(name)
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    containers = [c for g in groups for c in g["template"]["spec"]["containers"]]
    assert len(containers) == len(groups)
    secrets = set()
    for container in containers:
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["RAY_AUTH_MODE"].get("value") == "token", container["name"]
        token = env["RAY_AUTH_TOKEN"]
        assert "value" not in token, container["name"]  # from the Secret, never inline
        ref = token["valueFrom"]["secretKeyRef"]
        secrets.add((ref["name"], ref["key"]))
    assert len(secrets) == 1  # one token for the whole cluster
    (secret, key), = secrets
    if name == "kuberay-rayjob.yaml":  # the operator polls the job server: it must know the Secret
        assert spec["authOptions"] == {"mode": "token", "secretName": secret}
        assert key == "auth_token"  # the key KubeRay reads from authOptions.secretName
    header = (CLUSTER / "kuberay-raycluster.yaml").read_text().split("\napiVersion:")[0]
    assert f"kubectl create secret generic {secret}" in header and f"--from-literal={key}=" in header
    assert "export RAY_AUTH_MODE=token" in header and "export RAY_AUTH_TOKEN=" in header


def test_no_cluster_file_holds_a_token_or_a_secret_object():
    files = [p for p in [*CLUSTER.iterdir(), *(CLUSTER / "results").iterdir()]
             if p.is_file() and p.suffix in ("", ".yaml", ".sh", ".md", ".py", ".properties")]
    assert any(p.name == "ray-cluster.yaml" for p in files)
    for path in files:
        text = path.read_text()
        assert not TOKEN_FILE_HEX.search(text), path.name
        assert not re.search(r"RAY_AUTH_TOKEN=[0-9a-fA-F]", text), path.name
        if path.suffix == ".yaml":
            kinds = [d.get("kind") for d in yaml.safe_load_all(text) if d]
            assert "Secret" not in kinds, path.name


# --- the MLflow server script, run against a fake `mlflow` that reports its arguments ---------------

MLFLOW_ENV = {"MLFLOW_DB": "postgresql://mlflow:pw@db:5432/mlflow",
              "MLFLOW_ARTIFACTS": "s3://BUCKET/mlflow-artifacts"}
ADMIN_PASSWORD = "an-admin-password-for-tests"


def run_mlflow_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        fake = bin_dir / "mlflow"
        report = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], "
                  "'config': os.environ.get('MLFLOW_AUTH_CONFIG_PATH'), "
                  "'secret_key': bool(os.environ.get('MLFLOW_FLASK_SERVER_SECRET_KEY'))}))")
        fake.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(report)} \"$@\"\n")
        fake.chmod(0o755)
    # a clean environment: no MLFLOW_* of the developer's shell leaks in
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), **MLFLOW_ENV, **env}
    return subprocess.run(["bash", str(CLUSTER / "mlflow-server.sh")], env=full,
                          capture_output=True, text=True, timeout=30)


def started(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    from mlflow.cli import cli

    # the arguments are accepted by `mlflow server`'s own parser
    params = cli.commands["server"].make_context("server", report["argv"][1:]).params
    assert report["argv"][0] == "server" and params["serve_artifacts"]
    return {**report, "params": params}


def test_mlflow_script_binds_loopback_without_auth_by_default(tmp_path):
    report = started(run_mlflow_script(tmp_path))
    assert report["params"]["host"] == "127.0.0.1" and report["params"]["app_name"] is None
    assert report["params"]["backend_store_uri"] == MLFLOW_ENV["MLFLOW_DB"]


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::"])
def test_mlflow_script_refuses_a_non_loopback_host_without_auth(tmp_path, host):
    out = run_mlflow_script(tmp_path, MLFLOW_HOST=host)
    assert out.returncode != 0 and out.stdout == ""  # mlflow never ran
    assert f"refusing to serve {host} without authentication" in out.stderr
    assert "MLFLOW_AUTH=basic" in out.stderr


def test_mlflow_script_serves_a_non_loopback_host_only_when_told_a_proxy_is_in_front(tmp_path):
    report = started(run_mlflow_script(tmp_path, MLFLOW_HOST="0.0.0.0", MLFLOW_BEHIND_PROXY="1"))
    assert report["params"]["host"] == "0.0.0.0" and report["params"]["app_name"] is None


def test_mlflow_script_basic_auth_needs_an_admin_password(tmp_path):
    for env in ({"MLFLOW_AUTH": "basic"}, {"MLFLOW_AUTH": "basic", "MLFLOW_AUTH_ADMIN_PASSWORD": ""}):
        out = run_mlflow_script(tmp_path, **env)
        assert out.returncode != 0 and out.stdout == ""
        assert "needs MLFLOW_AUTH_ADMIN_PASSWORD" in out.stderr
    out = run_mlflow_script(tmp_path, MLFLOW_AUTH="ldap")
    assert out.returncode != 0 and "expected none or basic" in out.stderr


def load_mlflow_auth_config_reader():
    """mlflow.server.auth.config without mlflow.server.auth (which needs the mlflow[auth] extra)."""
    origin = Path(importlib.util.find_spec("mlflow").origin).parent / "server" / "auth" / "config.py"
    spec = importlib.util.spec_from_file_location("mlflow_auth_config", origin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_auth_config


def test_mlflow_script_basic_auth_runs_the_basic_auth_app_on_all_interfaces(tmp_path, monkeypatch):
    auth_db = "postgresql://mlflow:p%40ss@db:5432/mlflow_auth"  # a %-escaped password survives
    report = started(run_mlflow_script(tmp_path, MLFLOW_AUTH="basic", MLFLOW_AUTH_DB=auth_db,
                                       MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN_PASSWORD))
    assert report["params"]["app_name"] == "basic-auth" and report["params"]["host"] == "0.0.0.0"
    assert report["secret_key"]  # generated, as the basic-auth app requires one
    config = Path(report["config"])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert ADMIN_PASSWORD not in config.read_text()  # MLflow reads it from the environment
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(config))
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_PASSWORD", raising=False)
    monkeypatch.delenv("MLFLOW_AUTH_ADMIN_USERNAME", raising=False)
    parsed = load_mlflow_auth_config_reader()()
    assert parsed.database_uri == auth_db and parsed.admin_username == "admin"
    assert parsed.authorization_function == "mlflow.server.auth:authenticate_request_basic_auth"


def test_mlflow_manifest_environment_starts_the_basic_auth_app(tmp_path):
    env = {}
    for item in mlflow_container()["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        env[item["name"]] = f"secret-{ref['name']}-{ref['key']}" if ref else item["value"]
    report = started(run_mlflow_script(tmp_path, **env))
    assert report["params"]["app_name"] == "basic-auth" and report["params"]["host"] == "0.0.0.0"
    assert report["params"]["port"] == 5000
