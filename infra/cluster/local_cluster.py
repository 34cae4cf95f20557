"""Exercise the cluster paths on one machine: a Spark standalone master and worker, and a Ray
cluster of two nodes (a head and a second ``ray start`` node), all on loopback; the pipeline's entry
points run against them exactly as they would against remote ones.

    .venv/bin/python infra/cluster/local_cluster.py          # ~6 minutes on 2 cores

1. Spark standalone: ``spark-class ...Master`` and ``...Worker`` (own process groups); then
   ``spark-submit --master spark://127.0.0.1:PORT etl/prepare.py`` on ml-latest-small.
2. Ray: a head with 1 logical CPU and a second node with 2 (``ray start --address``); then
   ``ray job submit ... -- python training/train.py --num-workers 2 --placement SPREAD``: the
   ranks report their node, and the check asserts they are on different nodes. (The code is on
   PYTHONPATH rather than uploaded with --working-dir: see the comment at the submission.)
3. ``spark-submit --master spark://...`` of ``evaluation/score.py`` and ``evaluation/evaluate.py``.
4. Everything stopped; the check asserts no process group is left.

The log of the run goes to ``infra/cluster/results/local_cluster.md`` (committed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from infra import services  # noqa: E402
from infra.submit import spark_submit  # noqa: E402
from runtime.runs import summary_in  # noqa: E402

BIN = Path(sys.executable).parent
OUT = ROOT / "infra" / "cluster" / "results" / "local_cluster.md"


class Log:
    def __init__(self):
        self.lines: list[str] = []
        self.t0 = time.perf_counter()

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def without_machine_paths(text: str, work: Path) -> str:
    """The committed log names no directory of this machine: the scratch directory as $WORK, the
    checkout as ., the temp directory as $TMPDIR."""
    return (text.replace(str(work), "$WORK").replace(str(ROOT), ".")
            .replace(tempfile.gettempdir(), "$TMPDIR"))


def spawn(cmd: list[str], log_file: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log_file, "ab") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})


def wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f}s")


def spark_workers(ui_port: int) -> list[dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=3) as r:
            return json.loads(r.read())["workers"]
    except OSError:
        return []


def run(cmd: list[str], env: dict, log: Log, show: str) -> str:
    log(f"$ {show}")
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        log(text[-4000:])
        raise RuntimeError(f"{show.split()[0]} failed with exit {out.returncode}")
    log(f"  (exit 0 in {time.perf_counter() - t:.0f}s)")
    return text


def main() -> int:
    """The cluster's life in the order it happens (start, each stage's job, the checks, stop): a
    script's main, read top to bottom."""
    log = Log()
    work = Path(tempfile.mkdtemp(prefix="nce-cluster-"))
    import pyspark
    # SPARK_HOME named outright: spark-class otherwise looks for pyspark with whatever `python3`
    # is first on PATH, which is not this venv's unless the venv is activated
    env_spark = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(work / "spark-work"),
                 "SPARK_HOME": str(Path(pyspark.__file__).parent),
                 "PYSPARK_PYTHON": sys.executable}
    groups: dict[str, subprocess.Popen] = {}
    log("# Cluster paths on one machine: Spark standalone + a two-node Ray cluster")
    log()
    log(f"Command: `python infra/cluster/local_cluster.py`; {time.strftime('%Y-%m-%d')}; "
        f"{os.cpu_count()} cores.")
    log()
    log("```")
    try:
        # 1. Spark standalone master and worker
        port, ui, wui = services.free_ports(3)
        groups["spark-master"] = spawn(
            [str(BIN / "spark-class"), "org.apache.spark.deploy.master.Master", "--host",
             "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], work / "master.log", env_spark)
        groups["spark-worker"] = spawn(
            [str(BIN / "spark-class"), "org.apache.spark.deploy.worker.Worker", "--host",
             "127.0.0.1", "--cores", "2", "--memory", "6g", "--webui-port", str(wui),
             f"spark://127.0.0.1:{port}"], work / "worker.log", env_spark)
        wait_for(lambda: any(w["state"] == "ALIVE" for w in spark_workers(ui)), "Spark worker")
        w = spark_workers(ui)[0]
        log(f"spark standalone: master spark://127.0.0.1:{port}, worker {w['id']} "
            f"({w['cores']} cores, {w['memory']} MiB) ALIVE")
        master = f"spark://127.0.0.1:{port}"
        prepared = work / "data" / "ml-latest-small"
        cmd, env = spark_submit("etl/prepare.py", "--dataset", "ml-latest-small", "--input",
                                str(ROOT / "data" / "ml-latest-small" / "ratings.csv"),
                                "--output", str(prepared), "-q", master=master, driver_memory="2g")
        run(cmd, env, log, f"spark-submit --master {master} etl/prepare.py --dataset "
            f"ml-latest-small ... --output {prepared.name}")
        manifest = json.loads((prepared / "manifest.json").read_text())
        log(f"  manifest: spark master {manifest['spark']['master']}, "
            f"{manifest['counts']['users']} users, {manifest['counts']['items']} items")
        assert manifest["spark"]["master"] == master

        # 2. Ray: head (1 CPU) + a second node (2 CPUs)
        auth = services.ray_token(work)  # one token for both nodes and every client
        os.environ.update(auth)
        gcs, dash = services.free_ports(2, avoid=(port, ui, wui))
        head = services.start_ray_head(Path(tempfile.gettempdir()) / f"nce-rc-{os.getpid()}", gcs,
                                       dash, num_cpus=1, auth=auth, owner=os.getpid())
        groups["ray-head"] = head.proc
        groups["ray-node2"] = spawn(
            [str(BIN / "ray"), "start", "--address", head.address, "--block", "--num-cpus", "2",
             "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
             *services.ray_side_ports(head=False)], work / "node2.log",
            {**auth, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"})

        def nodes_alive() -> int:
            out = subprocess.run([str(BIN / "ray"), "list", "nodes", "--address", head.address,
                                  "--format", "json"], capture_output=True, text=True,
                                 env={**os.environ, **auth})
            try:
                return sum(n["state"] == "ALIVE" for n in json.loads(out.stdout))
            except (json.JSONDecodeError, KeyError, TypeError):
                return 0
        wait_for(lambda: nodes_alive() == 2, "second Ray node", timeout=180)
        log(f"ray: head {head.address} (1 CPU) + a second node (2 CPUs): 2 nodes ALIVE, "
            f"job server {head.url}")
        runs = work / "runs"
        mlflow_uri = f"sqlite:///{work / 'mlflow' / 'mlflow.db'}"
        (work / "mlflow").mkdir()
        args = ["python", str(ROOT / "training" / "train.py"), "--data", str(prepared), "--model",
                # up to 60 epochs, early stopping on validation: a trained model, so the
                # evaluation on the standalone cluster says something beyond "the path runs"
                "autorec", "--epochs", "60", "--num-workers", "2", "--placement", "SPREAD",
                "--runs-dir", str(runs), "--run-name", "two-nodes", "--mlflow-uri", mlflow_uri]
        # The code reaches both nodes as installed code (PYTHONPATH; the cluster image does the
        # same), not --working-dir: two nodes on one machine share Ray's session directory, and
        # the second node's runtime-env agent deletes the shared working_dir copy when its
        # workers finish, under the running driver (seen: its cwd vanished before MLflow logging)
        runtime_env = json.dumps({"env_vars": {"PYTHONPATH": str(ROOT)}})
        cmd = [str(BIN / "ray"), "job", "submit", "--address", head.url, "--runtime-env-json",
               runtime_env, "--", *args]
        env = {**os.environ, **auth}
        text = run(cmd, env, log, f"ray job submit --address {head.url} --runtime-env-json "
                   f"'{runtime_env}' -- " + " ".join(args))
        placed = sorted(set(re.findall(r"rank (\d)/2 on node (\w+)", text)))
        for rank, node in placed:
            log(f"  rank {rank} ran on node {node}")
        assert len({n for _, n in placed}) == 2, f"the ranks did not spread over 2 nodes: {placed}"
        summary = summary_in(text)
        log(f"  trained: {summary['epochs_run']} epochs, validation NDCG "
            f"{summary['best_valid_ndcg']:.4f}")

        # 3. scoring and evaluation on the standalone cluster
        recs, ev = work / "recs", work / "eval"
        cmd, env = spark_submit("evaluation/score.py", "--model", str(runs / "two-nodes"), "--data",
                                str(prepared), "--output", str(recs), "--exclude", "train,valid",
                                "-q", master=master, driver_memory="2g")
        run(cmd, env, log, f"spark-submit --master {master} evaluation/score.py --model "
            "runs/two-nodes ... --exclude train,valid")
        cmd, env = spark_submit("evaluation/evaluate.py", "--recs", str(recs), "--data",
                                str(prepared), "--output", str(ev), "-q", master=master,
                                driver_memory="2g")
        text = run(cmd, env, log, f"spark-submit --master {master} evaluation/evaluate.py ...")
        log(text.split("Cold-start users")[0].strip())
        apps = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/").read())
        log(f"spark master ran {len(apps['completedapps'])} applications: "
            + ", ".join(a["name"] for a in apps["completedapps"]))
    finally:
        for name, proc in reversed(groups.items()):
            services.stop(proc, timeout=5 if name.startswith("ray") else 10)
        left = [n for n, p in groups.items() if services.group_alive(p.pid)]
        log(f"stopped {', '.join(groups)}; process groups left: {left or 'none'}")
        log("```")
        log(f"\nTotal {time.perf_counter() - log.t0:.0f}s.")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(without_machine_paths("\n".join(log.lines) + "\n", work))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
