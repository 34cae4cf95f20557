"""A trained model from where users point at it: an MLflow model URI or a run's checkpoint.

    runs:/RUN_ID/model, models:/m-..., models:/NAME@ALIAS, models:/NAME/3   (MLflow)
    var/runs/NAME/model.pt, or the run directory var/runs/NAME               (training's output)

Either way the result is the same small record (weights as bytes, so Spark can broadcast them, the
model's name and arguments, from which ``models.registry`` rebuilds any model, the splits it was
trained on and, where known, the MLflow run it came from, so evaluation can log into that run).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from prepared.errors import UsageError
from models.base import Recommender
from models.registry import build as build_model
from models.registry import load_weights_only

MLFLOW_SCHEMES = ("runs:/", "models:/", "mlflow-artifacts:/")


@dataclass(frozen=True)
class ModelSource:
    uri: str                  # as given
    weights: bytes            # torch.save(state_dict)
    model: str                # its name in models.registry.MODELS
    model_args: dict          # the model's constructor arguments (n_items and its own)
    train_splits: str         # "train" or "train,valid": the model's input rows at scoring
    name: str                 # a label for tables and plots (model kind and run name)
    run_id: str | None        # the MLflow training run, when known
    tracking_uri: str | None

    def build(self) -> Recommender:
        return build(self.weights, self.model, self.model_args)

    @property
    def n_items(self) -> int:
        return int(self.model_args["n_items"])


def build(weights: bytes, name: str, model_args: dict) -> Recommender:
    """The model in eval mode from ``torch.save``d weights, its name and arguments (weights only:
    no code is unpickled)."""
    model = build_model(name, model_args)
    model.load_state_dict(load_weights_only(io.BytesIO(weights), "the model's weights"))
    return model.eval()


def _bytes(state_dict: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    return buf.getvalue()


def from_checkpoint(path: str) -> ModelSource:
    """A run's ``model.pt`` (or its directory); its ``run.json`` beside it names the MLflow run."""
    p = Path(path)
    if p.is_dir():
        p = p / "model.pt"
    if not p.exists():
        raise UsageError(f"--model {path}: no such file (a run's model.pt exists once its training "
                         "has finished; or pass an MLflow model URI such as runs:/RUN_ID/model)")
    saved = load_weights_only(p, f"--model {path}")
    try:
        name, args, config = saved["model"], saved["model_args"], saved.get("config", {})
    except Exception as e:
        raise UsageError(f"--model {path}: not a model file written by this version of "
                         f"training/train.py (no {e} in it); train it again") from None
    record_path = p.parent / "run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    return ModelSource(uri=path, weights=_bytes(saved["state_dict"]), model=name, model_args=args,
                       train_splits=config.get("train_splits", "train"),
                       name=f"{name} {config.get('run_name') or p.parent.name}",
                       run_id=record.get("mlflow_run_id"), tracking_uri=record.get("mlflow_uri"))


def from_mlflow(uri: str, tracking_uri: str) -> ModelSource:
    """A model logged by training (the weights-only pyfunc of ``models/pyfunc.py``)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow.set_tracking_uri(tracking_uri)
    try:
        info = mlflow.models.get_model_info(uri)
        pyfunc = mlflow.pyfunc.load_model(uri)
    except (MlflowException, OSError) as e:
        raise UsageError(f"--model {uri}: cannot load it from the tracking server {tracking_uri} "
                         f"({str(e).splitlines()[0]}); check the URI in the MLflow UI and pass "
                         "--mlflow-uri if the run lives elsewhere") from None
    wrapped = pyfunc.unwrap_python_model()
    if not hasattr(wrapped, "model") or not isinstance(wrapped.model, Recommender):
        raise UsageError(f"--model {uri}: not a model logged by this version of training/train.py")
    model: Recommender = wrapped.model
    cfg = pyfunc.model_config or {}
    run_name = None
    if info.run_id:
        try:
            run = mlflow.tracking.MlflowClient(tracking_uri).get_run(info.run_id)
            run_name = run.info.run_name
            splits = run.data.tags.get("train_splits")
        except MlflowException:
            splits = None
    return ModelSource(uri=uri, weights=_bytes(model.state_dict()), model=model.name,
                       model_args=model.model_args(),
                       train_splits=cfg.get("train_splits") or splits or "train",
                       name=f"{model.name} {run_name or info.run_id or uri}",
                       run_id=info.run_id, tracking_uri=tracking_uri)


def load_source(uri: str, tracking_uri: str | None = None) -> ModelSource:
    if uri.startswith(MLFLOW_SCHEMES):
        from runtime.tracking import tracking_uri as resolve
        return from_mlflow(uri, resolve(tracking_uri))
    return from_checkpoint(uri)
