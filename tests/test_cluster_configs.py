"""Static checks of the cluster configurations under infra/cluster: the manifests parse, name the
project's entry points, and every command line in them is accepted by that entry point's own
argument parser (a renamed flag fails here, not on a cluster)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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


def test_mlflow_manifest_runs_the_server_script():
    docs = list(yaml.safe_load_all((CLUSTER / "mlflow-k8s.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1] == "infra/cluster/mlflow-server.sh"
    assert "--backend-store-uri" in (CLUSTER / "mlflow-server.sh").read_text()


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
    for pkg in ("etl", "training", "evaluation", "infra"):
        assert f"COPY --chown=ray {pkg} {pkg}" in text
