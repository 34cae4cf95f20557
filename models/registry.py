"""Every model by name, and the one file format of a trained model.

    MODELS["nce-autorec"]                  the class
    build("puresvd", {"n_items": 9, "rank": 4})   a model from its name and model_args()
    save(model) / read(payload)            the dict written as model.pt: name, arguments, weights
                                           (``payload``: the layout, also for a run's weights)

A new model is one module in ``models/`` and one entry in ``MODELS`` below. An ensemble of trained
models (``models.ensemble``) is read and built here too, but is not in ``MODELS``: it is assembled
from runs (``experiment/ensemble.py``), never trained, searched or listed as a model to train.
"""

from __future__ import annotations

import pickle

import torch

from models.autorec import AutoRec, NCEAutoRec, NSAutoRec, OHNSAutoRec
from models.base import Recommender
from models.bpr import BPR
from models.cdae import CDAE
from models.cml import CML
from models.ease import EASE
from models.ensemble import Ensemble
from models.nce_plrec import NCEPLRec
from models.popularity import Popularity
from models.puresvd import PureSVD
from models.vae import VAECF
from models.wrmf import WRMF
from prepared.errors import UsageError

MODELS: dict[str, type[Recommender]] = {c.name: c for c in (
    AutoRec, OHNSAutoRec, NSAutoRec, NCEAutoRec,   # the paper's family (models/autorec/)
    PureSVD, NCEPLRec, EASE,                       # closed-form baselines
    WRMF,                                          # closed-form steps on Spark (ALS)
    BPR, CML, CDAE, VAECF,                         # gradient-trained baselines
    Popularity,                                    # the floor
)}


def model_class(name: str, what: str = "--model") -> type[Recommender]:
    if name not in MODELS:
        raise UsageError(f"{what} {name}: no such model; choose one of {', '.join(MODELS)}")
    return MODELS[name]


def build(name: str, model_args: dict) -> Recommender:
    """The model ``name`` from its ``model_args()`` (weights still to load); arguments left out
    take the model's defaults (its class's ``hyperparameters``, the one place they live). An
    ensemble's members are built from theirs."""
    if name == Ensemble.name:
        members = model_args.get("members")
        if not isinstance(members, list) or not all(
                isinstance(m, dict) and {"model", "model_args"} <= set(m) for m in members):
            raise UsageError("an ensemble's model arguments name no members (a list of "
                             "{model, model_args}); assemble it again with experiment/ensemble.py")
        return Ensemble([build(m["model"], m["model_args"]) for m in members])
    cls = model_class(name, "model")
    return cls(**{**cls.defaults(), **model_args})


def fitted(name: str, model_args: dict, state_dict: dict, what: str) -> Recommender:
    """The model ``name`` from its arguments with ``state_dict`` loaded (not yet in eval mode),
    once ``check_shapes`` has found that the arguments describe these weights."""
    check_shapes(name, model_args, state_dict, what)
    model = build(name, model_args)
    model.load_state_dict(state_dict)
    return model


def check_shapes(name: str, model_args: dict, state_dict: dict, what: str) -> None:
    """Refuse arguments that do not describe ``state_dict`` (a registry entry or model file
    altered to say width 10^9 beside a 2 MB file) before anything is allocated: the model is
    built on the meta device, which holds shapes only."""
    with torch.device("meta"):
        shell = build(name, model_args)
    want = {k: tuple(v.shape) for k, v in shell.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state_dict.items() if isinstance(v, torch.Tensor)}
    if want != got:
        key = next(iter(sorted(set(want) ^ set(got)) or
                        [k for k in sorted(want) if want[k] != got[k]]))
        raise UsageError(f"{what}: its model arguments do not describe its weights (e.g. "
                         f"{key}: the arguments make {want.get(key, 'nothing')}, the weights hold "
                         f"{got.get(key, 'nothing')}); the file was altered or written by other "
                         "code: train it again")


def payload(name: str, model_args: dict, state_dict: dict, **extra) -> dict:
    """What model.pt holds, the one layout (``read`` and evaluation's loaders take it apart):
    plain data and tensors only, so it loads weights-only; ``extra`` is what a run adds."""
    return {"model": name, "model_args": model_args, "state_dict": state_dict, **extra}


def save(model: Recommender, **extra) -> dict:
    """``payload`` of a model object (its weights on the CPU)."""
    return payload(model.name, model.model_args(),
                   {k: v.detach().cpu() for k, v in model.state_dict().items()}, **extra)


def read(payload: dict, what: str) -> Recommender:
    """The model in eval mode from a ``save`` payload; ``what`` names the file in errors."""
    if not isinstance(payload, dict) or "model" not in payload or "model_args" not in payload:
        raise UsageError(f"{what}: not a model file written by this version of training/train.py "
                         "(no model name and arguments in it); train it again")
    model = fitted(payload["model"], payload["model_args"], payload["state_dict"], what)
    return model.eval()


def load_weights_only(source, what: str):
    """``torch.load`` of tensors and plain data only (``weights_only=True``): everything this
    project writes (models, checkpoints, optimizer states, progress) loads so. A file whose pickle
    would build other objects, and so could run code when loaded, is refused in one line."""
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln), "")
        raise UsageError(
            f"{what}: refused: it holds Python objects other than tensors and plain data, and "
            f"loading them could run code{f' ({found})' if found else ''}. Only files written by "
            "this project's training load; retrain, or pass a file you trust that holds a plain "
            "dict of tensors") from None


def load_model_file(path: str) -> Recommender:
    """The model in eval mode from a run's ``model.pt``."""
    return read(load_weights_only(path, path), path)
