"""An evaluation in MLflow: each evaluated file's key metrics, its full metrics table and the
evaluation's files, logged into the file's training run (or a new run of the experiment
'evaluation')."""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.paired import PAIRED
from evaluation.spark_metrics import metric_key, split_name

if TYPE_CHECKING:
    from evaluation.evaluate import Recs

log = logging.getLogger("evaluation")

# what each run shows as metrics in MLflow: the paper's headline pair, the popularity share, the
# paired differences; every metric at every K and group goes into the run's metrics table instead
# (``evaluation-TARGET/metrics_table.json``), so the UI's metric list is a dozen names, not 150
KEY_METRICS = PAIRED
KEY_POPULARITY = ("share_top10pct", "median_popularity", "coverage")
KEY_PAIRED_TESTS = ("t_p_holm", "wilcoxon_p_holm")


def key_metrics(label: str, rows: list[dict], pop: dict, pairs: list[dict], target: str
                ) -> dict[str, float]:
    """The MLflow metrics of ``label``'s run: ``TARGET_ndcg``, ``TARGET_recall_at_50`` with
    ``_ci95`` and ``TARGET_users`` for warm users, the same as ``cold_*`` for cold users, three
    popularity numbers, and (in the reference's run) ``TARGET_paired_M_minus_LABEL`` with
    ``_ci95`` and the Holm-adjusted p-values."""
    out = {}
    for row in rows:
        if row["label"] != label or row["metric"] not in KEY_METRICS:
            continue
        prefix = target if row["group"] == "warm" else "cold"
        key = f"{prefix}_{metric_key(row['metric'])}"
        out[key], out[key + "_ci95"] = row["mean"], row["ci95"]
        out[f"{prefix}_users"] = row["users"]
    out.update({f"{target}_popularity_{k}": pop[label][k] for k in KEY_POPULARITY
                if label in pop})
    for p in pairs:
        if p["reference"] == label:
            key = f"{target}_paired_{metric_key(p['metric'])}_minus_{metric_key(p['label'])}"
            out[key], out[key + "_ci95"] = p["mean_difference"], p["ci95"]
            # an undefined test (every difference 0) has no p-value: logged as none, not NaN
            out.update({f"{key}_{t}": p[t] for t in KEY_PAIRED_TESTS if not math.isnan(p[t])})
    return out


def metrics_table(label: str, rows: list[dict]) -> dict:
    """``label``'s every metric (each K, warm and cold) as an MLflow table artifact: one row per
    metric, shown by the UI's artifact viewer and read back by ``MlflowClient.load_table``."""
    mine = [r for r in rows if r["label"] == label]
    columns = ["group", "metric", "K", "mean", "ci95", "users"]
    data = [[r["group"], *split_name(r["metric"]), r["mean"], r["ci95"], r["users"]] for r in mine]
    return {"columns": columns, "data": data}


def mark_table(client, run_id: str, path: str) -> None:
    """Tell the UI that ``path`` is a table (the tag ``MlflowClient.log_table`` sets; that call
    would append to a table logged before, and a re-evaluation must replace it)."""
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    tagged = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    if {"path": path, "type": "table"} not in tagged:
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS,
                       json.dumps([*tagged, {"path": path, "type": "table"}]))


def log_to_mlflow(recs: list[Recs], rows: list[dict], pop: dict, files: dict[str, bytes],
                  target: str, output: str, uri_flag: str | None,
                  pairs: list[dict] = ()) -> dict[str, str]:
    """Each file's key metrics (``key_metrics``), its metrics table and the files into its
    training run; returns label -> run id."""
    from mlflow.entities import Metric
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from runtime.tracking import add_test_description, check_reachable, experiment_id, tracking_uri

    out = {}
    ts = int(time.time() * 1000)
    for r in recs:
        uri = tracking_uri(uri_flag or r.manifest.get("mlflow_uri"))
        check_reachable(uri)
        client = MlflowClient(uri)
        run_id = r.manifest.get("mlflow_run_id")
        try:
            if run_id:
                client.get_run(run_id)
        except MlflowException:
            log.warning("MLflow run %s of %s is not in %s; logging into a new run", run_id,
                        r.label, uri)
            run_id = None
        if not run_id:
            run_id = client.create_run(experiment_id(client, uri, "evaluation"),
                                       run_name=f"evaluate {r.label}").info.run_id
            client.set_terminated(run_id)
        metrics = [Metric(k, float(v), ts, 0)
                   for k, v in key_metrics(r.label, rows, pop, pairs, target).items()]
        for i in range(0, len(metrics), 500):
            client.log_batch(run_id, metrics=metrics[i:i + 500])
        client.set_tag(run_id, f"evaluation.{target}.output", output)
        heads = [row for row in rows if row["label"] == r.label and row["group"] == "warm"
                 and row["metric"] in PAIRED]  # the headline pair: NDCG, Recall@50
        if heads:
            add_test_description(client, run_id, target, (
                f"({heads[0]['users']:,} warm users, mean ± 95% CI): " + ", ".join(
                    f"{row['metric']} {row['mean']:.4f} ± {row['ci95']:.4f}" for row in heads)))
        with tempfile.TemporaryDirectory() as d:
            for name, data in files.items():
                Path(d, name).write_bytes(data)
            Path(d, "metrics_table.json").write_text(json.dumps(metrics_table(r.label, rows)))
            client.log_artifacts(run_id, d, f"evaluation-{target}")
        mark_table(client, run_id, f"evaluation-{target}/metrics_table.json")
        out[r.label] = run_id
    return out
