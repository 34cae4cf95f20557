"""Search grids of ``experiment/run.py``: per model, each searched flag and its values.

    grid("small", ["nce-autorec", "puresvd"])   the default: one to a few trials per model
    grid("paper", ["nce-autorec"])              the paper's settings (its section 4.2)
    grid("my-grid.yaml", ["autorec"])           a user's: {model: {flag: [values]}} in YAML or JSON

A model's entry in a grid file may also be a list of such mappings, searched as the union of their
points (as scikit-learn's ParameterGrid takes a list of dicts): e.g. beta searched in joint mode
only, beside both modes at one beta, without the product of the two.

A key is a ``training/train.py`` flag with underscores (``lam``, ``num_negatives``); every point is
a ``TrainConfig`` that ``training.config.check`` accepts, so a flag a model does not take is refused
before anything runs. A model a named grid does not list is searched over nothing (its defaults).

The grids are not written here: each model declares, beside each hyperparameter, the values a
named grid searches (``models.hparams.HP.search``), and the run-level flags its grids search
(``run_axes``); ``NAMED`` collects them. Where the paper's settings do not map one to one
(protocol.md), the model's module says why (lambda's units in models/autorec/model.py, rho as dropout,
WRMF's alpha).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from models.hparams import grid_axes
from models.registry import MODELS
from prepared.errors import UsageError

# run-level flags that may be searched beside every model hyperparameter: what a model is and
# how it learns, never where or how long it runs
RUN_SEARCHABLE = {"beta", "lr", "batch_size", "num_negatives", "negatives"}
SEARCHABLE = RUN_SEARCHABLE | {name for cls in MODELS.values() for name in cls.hyperparameters} \
    | {name for cls in MODELS.values() for name, opt in cls.trainer.options.items()
       if opt.searchable}  # a model's training options it declares searchable (finetune_lr)


def named_grids() -> dict[str, dict[str, dict[str, list]]]:
    """{grid name: {model: {flag: values}}} from the models' declarations, every model in each
    (one a grid does not name is searched over nothing: its defaults)."""
    names = dict.fromkeys(g for cls in MODELS.values()
                          for g in [*(g for hp in cls.hyperparameters.values() for g in hp.search),
                                    *cls.run_axes])
    return {g: {m: grid_axes(cls, g) for m, cls in MODELS.items()} for g in names}


NAMED = named_grids()
PAPER, SMALL = NAMED["paper"], NAMED["small"]


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
