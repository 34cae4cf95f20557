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
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import torch

from models import registry as registry_module
from models.base import Recommender
from models.registry import check_shapes, fitted, load_weights_only
from prepared.errors import UsageError
from runtime.runs import MODEL_FILE, RUN_RECORD

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
    state = load_weights_only(io.BytesIO(weights), "the model's weights")
    return fitted(name, model_args, state, "the model").eval()


def _bytes(state_dict: dict) -> bytes:
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    return buf.getvalue()


def from_checkpoint(path: str) -> ModelSource:
    """A run's ``model.pt`` (or its directory); its ``run.json`` beside it names the MLflow run."""
    p = Path(path)
    if p.is_dir():
        p = p / MODEL_FILE
    if not p.exists():
        raise UsageError(f"--model {path}: no such file (a run's model.pt exists once its training "
                         "has finished; or pass an MLflow model URI such as runs:/RUN_ID/model)")
    saved = load_weights_only(p, f"--model {path}")
    try:
        name, args, config = saved["model"], saved["model_args"], saved.get("config", {})
    except Exception as e:
        raise UsageError(f"--model {path}: not a model file written by this version of "
                         f"training/train.py (no {e} in it); train it again") from None
    check_shapes(name, args, saved["state_dict"], f"--model {path}")  # before any executor builds it
    record_path = p.parent / RUN_RECORD
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    return ModelSource(uri=path, weights=_bytes(saved["state_dict"]), model=name, model_args=args,
                       train_splits=config.get("train_splits", "train"),
                       name=f"{name} {config.get('run_name') or p.parent.name}",
                       run_id=record.get("mlflow_run_id"), tracking_uri=record.get("mlflow_uri"))


ACCEPTED = ("accepted: a model logged by this project's training/train.py (the python_function "
            "flavour from the code file models/pyfunc.py, a weights-only state_dict and plain JSON "
            "config)")


def _refuse(uri: str, why: str) -> UsageError:
    return UsageError(f"--model {uri}: refused: {why}; {ACCEPTED}. Nothing of it was run")


def read_logged(uri: str, local: Path) -> tuple[str, dict, bytes]:
    """(model name, model_args, state_dict bytes) of a model downloaded to ``local``, checked
    against the one layout training logs (``runtime.tracking.pyfunc_spec``) without running any
    of its code: MLmodel is read as YAML data, the weights weights-only, the code file compared
    byte for byte with this installation's, and nothing else of it is imported or unpickled."""
    import yaml

    try:
        mlmodel = yaml.safe_load((local / "MLmodel").read_text())
    except (OSError, yaml.YAMLError) as e:
        raise _refuse(uri, f"its MLmodel file cannot be read as data ({str(e).splitlines()[0]})") from None
    flavors = (mlmodel or {}).get("flavors") or {}
    if set(flavors) != {"python_function"}:
        raise _refuse(uri, f"it has the flavour(s) {', '.join(sorted(flavors)) or 'none'}")
    conf = flavors["python_function"] or {}
    if conf.get("loader_module") != "mlflow.pyfunc.loaders.code_model" or "model_code_path" not in conf:
        held = conf.get("python_model") or conf.get("loader_module")
        raise _refuse(uri, f"it is a pickled or custom python model ({held}), which would run code "
                      "when loaded")
    code = local / Path(str(conf["model_code_path"])).name
    # read (never imported) through the package's loader: these modules may be imported from the
    # zip Spark ships to its workers (addPyFile), where pyfunc.py is no file on disk
    ours = pkgutil.get_data(registry_module.__package__, "pyfunc.py")
    if code.name != "pyfunc.py" or not code.is_file() or code.read_bytes() != ours:
        raise _refuse(uri, f"its code file {code.name} differs from this installation's "
                      "models/pyfunc.py (logged by another version of the project, or altered); "
                      "retrain it with this version")
    cfg = conf.get("config") or {}
    weights = (conf.get("artifacts") or {}).get("weights", {}).get("path")
    if not isinstance(cfg.get("model"), str) or not isinstance(cfg.get("model_args"), dict) \
            or not weights:
        raise _refuse(uri, "its config names no model and arguments, or it has no weights artifact")
    path = (local / weights).resolve()
    if local.resolve() not in path.parents or not path.is_file():
        raise _refuse(uri, f"its weights artifact {weights} is not a file inside the model")
    state = load_weights_only(path, f"--model {uri} (its weights)")
    return cfg["model"], cfg, _bytes(state)


def from_mlflow(uri: str, tracking_uri: str) -> ModelSource:
    """A model logged by training, rebuilt from its weights by this project's classes
    (``read_logged``): the tracking server is trusted to store bytes, never to run code here."""
    import tempfile

    from mlflow.exceptions import MlflowException

    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    with tempfile.TemporaryDirectory(prefix="nce-model-") as d:
        try:
            info = mlflow.models.get_model_info(uri)
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=d))
        except (MlflowException, OSError) as e:
            raise UsageError(f"--model {uri}: cannot load it from the tracking server {tracking_uri} "
                             f"({str(e).splitlines()[0]}); check the URI in the MLflow UI and pass "
                             "--mlflow-uri if the run lives elsewhere") from None
        name, cfg, weights = read_logged(uri, local)
    try:
        check = build(weights, name, cfg["model_args"])  # the weights fit the named model
    except UsageError as e:  # arguments that do not describe the weights
        raise _refuse(uri, str(e)) from None
    except (RuntimeError, TypeError, ValueError, KeyError) as e:  # wrong keys or args
        raise _refuse(uri, f"its weights do not fit a {name} with its arguments "
                      f"({str(e).splitlines()[0][:200]})") from None
    run_name, splits = None, None
    if info.run_id:
        try:
            run = mlflow.tracking.MlflowClient(tracking_uri).get_run(info.run_id)
            run_name, splits = run.info.run_name, run.data.tags.get("train_splits")
        except MlflowException:
            pass
    return ModelSource(uri=uri, weights=weights, model=check.name, model_args=check.model_args(),
                       train_splits=cfg.get("train_splits") or splits or "train",
                       name=f"{name} {run_name or info.run_id or uri}",
                       run_id=info.run_id, tracking_uri=tracking_uri)


def load_source(uri: str, tracking_uri: str | None = None) -> ModelSource:
    if uri.startswith(MLFLOW_SCHEMES):
        from runtime.tracking import tracking_uri as resolve
        return from_mlflow(uri, resolve(tracking_uri))
    return from_checkpoint(uri)
