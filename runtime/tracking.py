"""MLflow: where runs go, failing fast when the server is down, and what a training run logs.

The driver creates (or, for a rerun with the same run name, reopens) the MLflow run before Ray
starts, so that an unreachable server costs seconds, not a training. Rank 0 logs the per-epoch
metrics into that run (``EpochLogger``); the driver logs the final model and plots at the end.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from prepared.errors import UsageError
from prepared.protocol import TOP_K
from runtime.paths import project_root

ROOT = Path(__file__).resolve().parents[1]
RUN_NAME_TAG = "nce.run_name"
# the description MLflow's UI shows on a run's and an experiment's page (Markdown)
NOTE = "mlflow.note.content"
EXPERIMENT_NOTE = (
    "Training runs of the NCE-AutoRec project, one per model trained. To compare them on test: "
    "sort by `test_ndcg` and add the columns `test_ndcg`, `test_ndcg_ci95` and `test_recall_at_50` "
    "(Columns), or open the chart view and search `test_`. Test metrics are written into each "
    "run by evaluation/evaluate.py, with 95% confidence intervals (`_ci95`), and every metric at "
    "every K is the run's table `evaluation-test/metrics_table.json`; the tag `health` says "
    "whether a run beat the popularity baseline on validation.")
# the UI opens an experiment of this kind on its runs, not on the GenAI overview (MLflow 3)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def tracking_uri(flag: str | None) -> str:
    """--mlflow-uri, else MLFLOW_TRACKING_URI, else a SQLite store under ./mlflow/state (absolute)."""
    uri = flag or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_store_kind(uri, "--mlflow-uri" if flag else "MLFLOW_TRACKING_URI")
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            # a relative SQLite path would land in a Ray job's throw-away working-dir copy
            uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
        return uri
    store = project_root() / "mlflow" / "state"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def check_store_kind(uri: str, where: str) -> None:
    """MLflow 3 refuses its file store ('./mlruns', ``file://``) with a traceback from deep in
    the client, after the run's setup; say so first, with what to use instead."""
    if uri.startswith("file:") or (":" not in uri and not uri.startswith("databricks")):
        raise UsageError(
            f"{where}={uri} is an MLflow file store, which MLflow 3 no longer accepts for "
            "tracking: pass a SQLite store (sqlite:////ABS/PATH/mlflow.db), a server "
            "(http://HOST:PORT; `make stack` starts one on 127.0.0.1:5000), or leave it unset "
            "for the project's own SQLite store (mlflow/state/)")


def check_reachable(uri: str, timeout: float = 5.0) -> None:
    """Fail in seconds with the fix when a tracking server does not answer."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as r:
                if r.status != 200:
                    raise OSError(f"HTTP {r.status}")
        except (OSError, urllib.error.URLError) as e:
            raise UsageError(
                f"MLflow tracking server {uri} is not reachable ({e}). Start one (make stack, "
                "which starts MLflow on 127.0.0.1:5000 and a Ray head; or mlflow server "
                "--backend-store-uri sqlite:///ABS/mlflow.db --host 127.0.0.1 --port 5000) or pass "
                "another --mlflow-uri") from None
    elif uri.startswith("sqlite:///"):
        parent = Path(uri[len("sqlite:///"):]).parent
        if not parent.is_dir():
            raise UsageError(f"--mlflow-uri {uri}: directory {parent} does not exist; create it "
                             "or point --mlflow-uri elsewhere")


def artifact_root(uri: str) -> str | None:
    """Artifacts of a SQLite store sit beside the database (MLflow's default is ./mlruns of the
    current directory, which differs per caller and is lost inside a Ray job)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "artifacts").as_uri()
    return None


def experiment_id(client, uri: str, name: str) -> str:
    """The id of the MLflow experiment ``name`` in the store ``uri`` (``client``'s), created if
    there is none yet, its artifacts where ``artifact_root`` puts them."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        return client.create_experiment(name, artifact_location=artifact_root(uri),
                                        tags={NOTE: EXPERIMENT_NOTE, **EXPERIMENT_KIND})
    for key, value in {NOTE: EXPERIMENT_NOTE, **EXPERIMENT_KIND}.items():
        if key not in exp.tags:  # an experiment made before, or by someone else: theirs kept
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def describe_run(uri: str, run_id: str, title: str, summary: dict) -> None:
    """The run's description: what it trained on what, its best validation NDCG and its health;
    ``evaluation/evaluate.py`` adds the test metrics (``add_test_description``)."""
    from mlflow.tracking import MlflowClient

    pop = summary.get("valid_ndcg_popularity")
    lines = [f"**{title}**", ""]
    if summary.get("best_valid_ndcg") is not None:
        lines.append(f"- validation NDCG@{TOP_K} {summary['best_valid_ndcg']:.4f} at epoch "
                     f"{summary.get('best_epoch')} of {summary.get('epochs_run')}"
                     + (f" (popularity {pop:.4f})" if pop is not None else ""))
    if summary.get("health"):
        lines.append(f"- health: {summary['health']}")
    lines.append("- test metrics: not evaluated yet (evaluation/evaluate.py writes them here)")
    MlflowClient(uri).set_tag(run_id, NOTE, "\n".join(lines))


def add_test_description(client, run_id: str, target: str, text: str) -> None:
    """Put ``- TARGET TEXT`` into the run's description in place of an earlier line of that
    target (and of the "not evaluated yet" line when the target is test)."""
    run = client.get_run(run_id)
    old = run.data.tags.get(NOTE, f"**{run.info.run_name}**\n")
    kept = [line for line in old.split("\n") if not line.startswith(f"- {target} ")
            and not (target == "test" and line.startswith("- test metrics:"))]
    client.set_tag(run_id, NOTE, "\n".join([*kept, f"- {target} {text}"]))


def log_dataset(uri: str, run_id: str, manifest: dict, source: str, context: str) -> None:
    """The prepared dataset as the run's MLflow dataset input (the UI's "Datasets" column): its
    name, a digest of what it was made from and how, its path, its counts as the profile. Once
    per run (a resumed run has it already). The digest is of the content, and MLflow keeps one
    record per name and digest in an experiment: a copy of the data shows the first path seen."""
    import hashlib

    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    if client.get_run(run_id).inputs.dataset_inputs:
        return
    made_of = {k: manifest.get(k) for k in ("inputs", "parameters", "counts")}
    digest = hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()
    counts = manifest.get("counts", {})
    profile = {k: counts[k] for k in ("users", "items", "cold_users", "positives") if k in counts}
    dataset = Dataset(name=manifest.get("dataset", "dataset"), digest=digest[:10],
                      source_type="local" if "://" not in source else source.split("://")[0],
                      source=json.dumps({"uri": source}), profile=json.dumps(profile))
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, tags=[
        InputTag("mlflow.data.context", context)])])


def open_run(uri: str, experiment: str, run_name: str, run_id: str | None,
             tags: dict[str, str]) -> str:
    """The id of the MLflow run for ``run_name``: ``run_id`` if given (a resumed run), else new."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    if run_id:
        try:
            run = client.get_run(run_id)
            client.update_run(run.info.run_id, status="RUNNING")
            return run.info.run_id
        except Exception:  # the store was reset: start a fresh run below
            pass
    run = client.create_run(experiment_id(client, uri, experiment), run_name=run_name,
                            tags={RUN_NAME_TAG: run_name, **tags})
    return run.info.run_id


def log_params(uri: str, run_id: str, params: dict) -> None:
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    have = client.get_run(run_id).data.params
    new = [Param(k, str(v)) for k, v in params.items() if k not in have]
    for i in range(0, len(new), 100):
        client.log_batch(run_id, params=new[i:i + 100])


def log_text(uri: str, run_id: str, text: str, artifact_file: str) -> None:
    """``text`` as the run's artifact ``artifact_file`` (e.g. its config.yaml)."""
    from mlflow.tracking import MlflowClient

    MlflowClient(uri).log_text(run_id, text, artifact_file)


class EpochLogger:
    """Per-epoch metrics into an existing run (used by rank 0 inside the Ray worker).

    A tracking outage must neither stop nor stall a long training: requests give up after two
    short retries (MLflow's defaults retry for minutes), epochs that could not be sent are kept and
    sent with the next one that can, and the driver backfills from the checkpoint's history at
    the end (``backfill``), so an epoch is never silently missing from the run."""

    def __init__(self, uri: str, run_id: str):
        from mlflow.tracking import MlflowClient

        for var, value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"),
                           ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                           ("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")):
            os.environ.setdefault(var, value)  # this worker process only
        self.client, self.run_id, self.uri = MlflowClient(uri), run_id, uri
        self.pending: list = []
        self.down_since: int | None = None

    def log(self, record: dict, step: int) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self.pending += [Metric(k, float(v), ts, step) for k, v in record.items()
                         if isinstance(v, int | float) and k not in ("epoch",)]
        try:
            for i in range(0, len(self.pending), 500):
                self.client.log_batch(self.run_id, metrics=self.pending[i:i + 500])
        except Exception as e:
            if self.down_since is None:
                self.down_since = step
                print(f"warning: MLflow at {self.uri} failed at epoch {step} "
                      f"({str(e).splitlines()[0][:160]}); training goes on, the metrics are kept "
                      "and sent when it answers again", flush=True)
            return
        if self.down_since is not None:
            print(f"MLflow answers again: sent the metrics of epochs {self.down_since}..{step}",
                  flush=True)
            self.down_since = None
        self.pending = []


def backfill(uri: str, run_id: str, history: list[dict]) -> int:
    """Log every epoch of ``history`` that the run lacks (an outage the worker could not bridge);
    returns how many epochs were added."""
    import time

    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    keys = [k for k in (history[0] if history else {}) if k != "epoch"]
    if not keys:
        return 0
    have = {m.step for m in client.get_metric_history(run_id, keys[0])}
    ts = int(time.time() * 1000)
    missing = [r for r in history if r["epoch"] not in have]
    metrics = [Metric(k, float(v), ts, r["epoch"]) for r in missing for k, v in r.items()
               if isinstance(v, int | float) and k != "epoch"]
    for i in range(0, len(metrics), 500):
        client.log_batch(run_id, metrics=metrics[i:i + 500])
    return len(missing)


def mark_failed(uri: str, run_id: str) -> None:
    """Mark the run FAILED if the server answers; never hides the error being reported."""
    from mlflow.tracking import MlflowClient

    try:
        check_reachable(uri, timeout=3)
        MlflowClient(uri).set_terminated(run_id, status="FAILED")
    except Exception as e:
        print(f"warning: could not mark MLflow run {run_id} FAILED ({str(e).splitlines()[0]})",
              flush=True)


def wait_reachable(uri: str, seconds: float) -> bool:
    """Whether the tracking server answers within ``seconds`` (a restart in progress)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            check_reachable(uri, timeout=3)
            return True
        except UsageError:
            if time.monotonic() > deadline:
                return False
            time.sleep(2)


def pyplot():
    """``matplotlib.pyplot`` drawing off-screen (the Agg backend: figures become files, and no
    display is needed), for every figure the project draws."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def learning_curves(history: list[dict], title: str):
    """A figure: each head's training loss, and validation NDCG / Recall@50, per epoch."""
    plt = pyplot()
    epochs = [r["epoch"] for r in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key in sorted({k for r in history for k in r if k.startswith("loss_")}):
        xs = [r["epoch"] for r in history if key in r]
        a.plot(xs, [r[key] for r in history if key in r], label=key[5:])
    a.set(xlabel="epoch", ylabel="training loss", yscale="log", title="losses")
    if a.lines:  # a closed-form fit has no loss curve
        a.legend()
    for key, label in (("valid_ndcg", "NDCG"), ("valid_recall_at_50", "Recall@50")):
        xs = [r["epoch"] for r in history if key in r]
        if xs:
            b.plot(xs, [r[key] for r in history if key in r], marker=".", label=label)
    b.set(xlabel="epoch", title="validation", xlim=(0.5, max(epochs, default=1) + 0.5))
    if b.lines:  # a final retraining has no validation curve
        b.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


PYFUNC_CODE = ROOT / "models" / "pyfunc.py"  # the one code file a logged model may name


def pyfunc_spec(*, weights: Path, item_ids: Path | None, model: str, model_args: dict,
                model_info: dict) -> dict:
    """The arguments of ``mlflow.pyfunc.log_model``/``save_model`` for a trained model: the code
    file ``models/pyfunc.py`` (models from code: nothing pickled), the weights (a ``state_dict``,
    loaded weights-only), the item id map (a one-column Parquet of ids in index order, so a service
    takes the dataset's ids), and plain JSON config. ``evaluation/model_source.py`` accepts exactly
    this layout. ``model_info`` (training splits) goes into the config for scoring."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    artifacts = {"weights": str(weights)}
    if item_ids is not None:
        artifacts["item_ids"] = str(item_ids)
    # params only: the request's columns are checked by models/serving.py, whose messages say
    # more than MLflow's schema enforcement would (and it takes ids as strings or whole numbers)
    signature = ModelSignature(
        outputs=Schema([ColSpec("string", "item_ids"), ColSpec("long", "item_indices"),
                        ColSpec("double", "scores"), ColSpec("long", "unknown_items")]),
        params=ParamSchema([ParamSpec("k", "long", TOP_K), ParamSpec("exclude_seen", "boolean", True),
                            ParamSpec("unknown_items", "string", "refuse")]))
    return dict(python_model=str(PYFUNC_CODE), artifacts=artifacts,
                model_config={"model": model, "model_args": model_args, **model_info},
                # the model code and the contract it imports (errors); no pickled objects
                code_paths=[str(ROOT / "models"), str(ROOT / "prepared")], signature=signature,
                pip_requirements=["torch", "numpy", "pandas", "scipy", "scikit-learn", "pyarrow"])


def log_trained(uri: str, run_id: str, *, state_dict: dict, item_ids: list[str], **final) -> str:
    """``log_final`` of a model in memory: its weights and the dataset's item ids (index order)
    written to the files the pyfunc ships, in a temporary folder; returns the model's URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    with tempfile.TemporaryDirectory() as d:
        weights, ids = Path(d) / "weights.pt", Path(d) / "item_ids.parquet"
        torch.save(state_dict, weights)
        pq.write_table(pa.table({"item_id": pa.array(item_ids, pa.string())}), ids)
        return log_final(uri, run_id, weights=weights, item_ids=ids, **final)


def log_final(uri: str, run_id: str, *, weights: Path, item_ids: Path | None, model: str,
              model_args: dict, model_info: dict, manifest: dict, history: list[dict],
              summary: dict, title: str) -> str:
    """Log the returned model (``pyfunc_spec``), manifest, curves; returns the model's URI."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_id=run_id):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "manifest.json").write_text(json.dumps(manifest, indent=2))
            (Path(d) / "history.json").write_text(json.dumps(history, indent=2))
            mlflow.log_artifact(str(Path(d) / "manifest.json"), "dataset")
            mlflow.log_artifact(str(Path(d) / "history.json"))
        mlflow.log_figure(learning_curves(history, title), "learning_curves.png")
        mlflow.log_metrics({k: float(v) for k, v in summary.items()
                            if isinstance(v, int | float)})
        info = mlflow.pyfunc.log_model(name="model", **pyfunc_spec(
            weights=weights, item_ids=item_ids, model=model, model_args=model_args,
            model_info=model_info))
    return info.model_uri
