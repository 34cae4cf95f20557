"""Search grids of ``training/experiment.py``: per model, each searched flag and its values.

    grid("small", ["nce-autorec", "puresvd"])   the default: 45 trials over every model
    grid("paper", ["nce-autorec"])              the paper's settings (its section 4.2)
    grid("my-grid.yaml", ["autorec"])           a user's: {model: {flag: [values]}} in YAML or JSON

A model's entry in a grid file may also be a list of such mappings, searched as the union of their
points (as scikit-learn's ParameterGrid takes a list of dicts): e.g. beta searched in joint mode
only, beside both modes at one beta, without the product of the two.

A key is a ``training/train.py`` flag with underscores (``lam``, ``num_negatives``); every point is
a ``TrainConfig`` that ``training.config.check`` accepts, so a flag a model does not take is refused
before anything runs. A model a named grid does not list is searched over nothing (its defaults).

Where the paper's settings do not map one to one (protocol.md):
- lambda: the paper's 1e-7..1e4 on ||W||_F^2; the AutoRec family's lambda here is in overlap units
  (lambda * omega * mean(W^2) per matrix, models/autorec.py), so the same numbers mean other things;
- rho (corruption) 0.1..1 becomes ``dropout`` 0.1..0.9 (1 drops every input);
- alpha: the paper's negative values for WRMF would weigh positives below the unobserved
  entries (confidence 1 + alpha); only 0, 0.1, 1, 10, 100 are kept; NCE-PLRec has no alpha here.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from models.autorec import MODES
from models.registry import MODELS
from prepared.errors import UsageError

# flags that may be searched: what a model is, never where or how long it runs
SEARCHABLE = {"width", "lam", "rank", "alpha", "iterations", "hidden", "dropout", "kl_cap",
              "anneal_steps", "margin", "neg_ratio", "cov_weight", "mode", "beta", "lr",
              "batch_size", "num_negatives", "negatives", "finetune_lr",
              "embed_weight", "embed_lam"}

_R = [50, 100, 200, 500]
_LAM = [10.0 ** e for e in range(-7, 5)]
_BETA = [0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3]
_N = [5, 50, 500, 5000, 50000, 500000]
_RHO = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]

PAPER = {
    "autorec": {"width": _R, "lam": _LAM},
    "ohns-autorec": {"width": _R, "lam": _LAM, "num_negatives": _N},
    "ns-autorec": {"width": _R, "lam": _LAM, "num_negatives": _N, "mode": list(MODES)},
    "nce-autorec": {"width": _R, "lam": _LAM, "beta": _BETA, "mode": list(MODES)},
    "puresvd": {"rank": _R},
    "nce-plrec": {"rank": _R, "lam": _LAM, "beta": _BETA},
    "ease": {"lam": _LAM},
    "wrmf": {"rank": _R, "lam": _LAM, "alpha": [0.0, 0.1, 1.0, 10.0, 100.0]},
    "bpr": {"width": _R, "lam": _LAM},
    "cml": {"width": _R},
    "cdae": {"width": _R, "lam": _LAM, "dropout": _RHO},
    "vae-cf": {"width": _R, "lam": _LAM, "dropout": _RHO},
    "popularity": {},
}

# 45 trials over every model, joint mode only: on ml-100k a joint trial takes about 1.5 minutes
# on 2 cores, a fine-tune one several times that (phase 1 runs until its loss converges, 135-200
# epochs), so the modes are searched by --grid paper or a grid file. lambda (overlap units) a
# decade around each model's default: best values lay within 1-10 for the one-headed models and
# 3-30 for the two-headed on four datasets (benchmarks/results/tune_defaults.md)
_ONE_HEAD_LAM, _TWO_HEAD_LAM = [1.0, 3.0, 10.0], [3.0, 10.0, 30.0]
SMALL = {
    "autorec": {"lam": _ONE_HEAD_LAM},
    "ohns-autorec": {"lam": _ONE_HEAD_LAM},
    "ns-autorec": {"lam": _TWO_HEAD_LAM},
    "nce-autorec": {"lam": _TWO_HEAD_LAM, "beta": [0.8, 1.0]},
    "puresvd": {"rank": [20, 50, 100]},
    "nce-plrec": {"rank": [100, 200], "lam": [1000.0, 10000.0], "beta": [0.8, 1.0]},
    "ease": {"lam": [100.0, 500.0, 2000.0]},
    "wrmf": {"rank": [50], "lam": [0.1, 1.0], "alpha": [1.0, 5.0]},
    "bpr": {"lam": [1e-5, 1e-4, 1e-3]},
    "cml": {"margin": [0.5, 1.0]},
    "cdae": {"lam": [0.001, 0.01], "dropout": [0.2, 0.5]},
    "vae-cf": {"dropout": [0.2, 0.5]},
    "popularity": {},
}

NAMED = {"paper": PAPER, "small": SMALL}


def read_grid_file(path: str) -> dict:
    """A user's grid file: YAML (.yaml/.yml) or JSON, ``{model: {flag: [values]}}``, where a
    model's entry may also be a list of ``{flag: [values]}`` (the union of their points)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--grid {path}: neither a named grid ({', '.join(NAMED)}) nor a file; "
                         "pass one of those names or the path of a YAML/JSON file")
    text = p.read_text()
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as e:  # noqa: BLE001 (both parsers' errors name the line)
        raise UsageError(f"--grid {path}: not valid {'YAML' if p.suffix in ('.yaml', '.yml') else 'JSON'}"
                         f": {str(e).splitlines()[0]}") from None
    sub_grids = lambda v: isinstance(v, list) and v and all(isinstance(g, dict) for g in v)
    if not isinstance(data, dict) or not all(isinstance(v, dict | None) or sub_grids(v)
                                             for v in data.values()):
        raise UsageError(f"--grid {path}: want a mapping of model -> {{flag: [values]}} or a list "
                         "of those, e.g. {\"autorec\": {\"lam\": [10, 30]}}")
    return {m: [dict(g) for g in v] if isinstance(v, list) else dict(v or {})
            for m, v in data.items()}


def grid(spec: str, models: list[str]) -> dict[str, list[dict[str, list]]]:
    """Per model (in ``models``' order), its sub-grids (one unless a grid file lists several):
    each searched flag and its values; checked."""
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise UsageError(f"--models: no model {', '.join(unknown)}; choose from "
                         f"{', '.join(MODELS)}")
    source = NAMED.get(spec)
    if source is None:
        source = read_grid_file(spec)
        stray = [m for m in source if m not in MODELS]
        if stray:
            raise UsageError(f"--grid {spec}: no model {', '.join(stray)}; choose from "
                             f"{', '.join(MODELS)}")
    out = {}
    for m in models:
        entry = source.get(m, {})
        out[m] = [_checked(spec, m, axes) for axes in (entry if isinstance(entry, list) else [entry])]
    return out


def _checked(spec: str, model: str, axes: dict) -> dict[str, list]:
    out = {}
    for key, values in axes.items():
        if key not in SEARCHABLE:
            raise UsageError(f"--grid {spec}: {model}: {key!r} cannot be searched; searchable "
                             f"flags: {', '.join(sorted(SEARCHABLE))}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise UsageError(f"--grid {spec}: {model}: {key} has no values, so the grid has no "
                             "points; give at least one value or drop the key")
        out[key] = list(values)
    return out


def points(axes: dict[str, list] | list[dict[str, list]]) -> list[dict]:
    """Every combination of the axes' values (one empty point for no axes); for a list of
    sub-grids, the union of theirs in order, each point once."""
    out, seen = [], set()
    for sub in axes if isinstance(axes, list) else [axes]:
        keys = list(sub)
        for combo in itertools.product(*(sub[k] for k in keys)):
            p = dict(zip(keys, combo))
            key = tuple(sorted(p.items()))
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def point_name(model: str, point: dict) -> str:
    """A short, stable name of one point, e.g. ``nce-autorec-lam30-beta0.8-modejoint``."""
    fmt = lambda v: f"{v:g}" if isinstance(v, float) else str(v)
    parts = [f"{k.replace('_', '')}{fmt(v)}" for k, v in sorted(point.items())]
    return "-".join([model, *parts]) if parts else f"{model}-defaults"
