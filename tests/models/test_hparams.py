"""A model declares its hyperparameters once (models/hparams.py); train.py's flags, their checks and
the named grids are generated from the declarations. A toy model with a knob of its own reaches
--help, a grid file, the experiment's trial configurations and Tune's round trip through its
registry line alone."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiment import grids
from models.hparams import HP
from models.registry import MODELS
from prepared.errors import UsageError
from training.config import TrainConfig, check, hyper_fields

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("hp, value, said", [
    (HP(200, "w", lo=1, hi=100_000, why="the paper: 50..500"), 0,
     "must be in 1..100000 (the paper: 50..500)"),
    (HP(200, "w", lo=1, hi=100_000), 100_000, None),
    (HP(0.5, "p", lo=0, hi=1, open_hi=True), 1.0, "must be in [0, 1)"),
    (HP(0.5, "p", lo=0, hi=1, open_hi=True), 0.0, None),
    (HP(500.0, "l", lo=0, open_lo=True, hi=1e6, open_hi=True), 0.0, "must be in (0, 1000000)"),
    (HP(500.0, "l", lo=0, open_lo=True, hi=1e6, open_hi=True), 1e-9, None),
    (HP(2000, "s", lo=1), 0, "must be >= 1"),
    (HP("joint", "m", choices=("joint", "alternating")), "both", "choose one of joint, alternating"),
    (HP(3, "i", lo=1), 2.5, "want an integer"),
    (HP(3, "i", lo=1), True, "want an integer"),
    (HP(1.0, "f", lo=0), 2, None),  # an int where a float is wanted is a number
    (HP(1.0, "f", lo=0), "x", "want a number"),
    (HP(None, "n", type=float, lo=0), 0.5, None),
    # NaN passes every comparison (nan < 0 and nan > 1 are both false); an infinity is no setting
    (HP(1.0, "f", lo=0, hi=1), float("nan"), "want a finite number"),
    (HP(1.0, "f", lo=0), float("inf"), "want a finite number"),
    (HP(1.0, "f"), float("-inf"), "want a finite number"),
])
def test_a_declared_range_says_what_is_wrong(hp, value, said):
    assert hp.problem(value) == said


def test_each_model_checks_its_own_range_of_a_shared_flag():
    ok = lambda **kw: check(TrainConfig(data="d", **kw))
    ok(model="cdae", neg_ratio=0)  # CDAE's whole row
    with pytest.raises(UsageError, match=r"^--neg-ratio 0: must be in 1\.\.10000 \(0, the whole row, "
                                         "is cdae's\\)$"):
        ok(model="bpr", neg_ratio=0)
    ok(model="autorec", lam=0.0)
    with pytest.raises(UsageError, match=r"^--lam 0.0: must be in \(0, 1000000\)"):
        ok(model="ease", lam=0.0)  # EASE's diagonal must be positive to invert
    with pytest.raises(UsageError, match=r"^--width 0: must be in 1\.\.100000 \(the paper: 50\.\.500\)$"):
        ok(model="nce-autorec", width=0)


def test_a_shared_flag_is_one_type_and_one_help_across_models():
    for f in hyper_fields(MODELS):
        name = f[0]
        hps = [c.hyperparameters[name] for c in MODELS.values() if name in c.hyperparameters]
        assert len({hp.kind for hp in hps}) == 1 and len({hp.help for hp in hps}) == 1, name
    clash = {"a": type("A", (), {"hyperparameters": {"k": HP(1, "one")}}),
             "b": type("B", (), {"hyperparameters": {"k": HP(1.0, "one")}})}
    with pytest.raises(TypeError, match="'k' is declared with 2 types"):
        hyper_fields(clash)


def declared_points(cls, grid_name: str) -> int:
    """How many points a model's declarations give the named grid: the product of the number of
    values of each hyperparameter it searches there and of each of its run-level axes (one, for a
    model that searches nothing: its defaults), counted here without ``experiment.grids``."""
    axes = {k: hp.search[grid_name] for k, hp in cls.hyperparameters.items() if grid_name in hp.search}
    axes.update(cls.run_axes.get(grid_name, {}))
    return math.prod(len(set(values)) for values in axes.values())


def test_the_named_grids_are_the_models_declared_search_values():
    assert set(grids.NAMED) == {"paper", "small"}
    # every registered model is searched by the default grid, with as many trials as its own
    # declarations give: adding a model adds its points, nothing else changes
    small = grids.grid("small", list(MODELS))
    assert list(small) == list(MODELS)
    for name, cls in MODELS.items():
        assert len(grids.points(small[name])) == declared_points(cls, "small") >= 1, name
    assert sum(len(grids.points(a)) for a in grids.SMALL.values()) == sum(
        declared_points(cls, "small") for cls in MODELS.values())
    for name, cls in MODELS.items():
        for g, axes in grids.NAMED.items():
            want = {k: list(hp.search[g]) for k, hp in cls.hyperparameters.items() if g in hp.search}
            assert axes[name] == {**want, **cls.run_axes.get(g, {})}, (g, name)
    assert set(grids.PAPER["nce-autorec"]) == {"width", "lam", "mode", "beta"}
    assert grids.PAPER["ohns-autorec"]["num_negatives"][0] == 5


TOY = textwrap.dedent('''
    import json, sys
    import torch
    from models import registry
    from models.base import Recommender
    from models.hparams import HP, Option
    from models.training import Training

    class ToyTraining(Training):
        """How the toy trains: at the pace its one training option sets."""
        options = {"toy_pace": Option("calm", "how the toy trains", choices=("calm", "brisk"),
                                      resumable=True, searchable=True,
                                      refused="{model} has no pace; only {takers} do")}

        def __init__(self, model, options=None):
            super().__init__(model, options)
            self.pace = getattr(options, "toy_pace", "calm")

    class Toy(Recommender):
        """A model with a knob no other model has, added by its module and one registry line."""
        name = "toy"
        hyperparameters = {"toy_knob": HP(7, "how toy the toy is", lo=1, hi=10,
                                          search={"small": [1, 2]})}
        trainer = ToyTraining

        def __init__(self, n_items, toy_knob):
            super().__init__()
            self.n_items, self.toy_knob = n_items, toy_knob
            self.w = torch.nn.Parameter(torch.zeros(n_items))

        def model_args(self):
            return {"n_items": self.n_items, "toy_knob": self.toy_knob}

    registry.MODELS["toy"] = Toy  # the registry line

    import experiment.plan
    from experiment import grids
    from training.config import TrainConfig, check
    from training.loop import build_model
    from training.run_record import RESUMABLE_CHANGES
    from training.train import build_parser
    from prepared.errors import UsageError

    out = {"help": build_parser().format_help()}
    grid_file = sys.argv[1]
    axes = grids.grid(grid_file, ["toy"])["toy"]
    cfg = experiment.plan.ExperimentConfig(data="/abs/d", models="toy", grid=grid_file)
    configs = [experiment.plan.trial_config(cfg, "/abs/root", "toy", p) for p in grids.points(axes)]
    for c in configs:
        check(c)
    # what Tune ships to a trial (param_space) and the trial rebuilds
    shipped = [TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) for c in configs]
    out["knobs"] = [c.toy_knob for c in shipped]
    out["resolved"] = TrainConfig(data="d", model="toy").resolved()
    out["small"] = grids.grid("small", ["toy"])["toy"]
    out["built"] = Toy.from_config(5, shipped[0].hyperparameters()).model_args()
    try:
        check(TrainConfig(data="d", model="toy", toy_knob=11))
    except UsageError as e:
        out["refused"] = str(e)
    try:
        check(TrainConfig(data="d", model="autorec", toy_knob=2))
    except UsageError as e:
        out["elsewhere"] = str(e)
    try:
        check(TrainConfig(data="d", model="autorec", toy_pace="brisk"))
    except UsageError as e:
        out["pace_elsewhere"] = str(e)
    _, policy = build_model(TrainConfig(data="d", model="toy", toy_pace="brisk"), 5, None)
    out["pace"] = policy.pace
    out["pace_resumable"] = "toy_pace" in RESUMABLE_CHANGES
    out["pace_searchable"] = "toy_pace" in grids.SEARCHABLE
    print(json.dumps(out))
''')


def test_a_toy_model_with_a_new_hyperparameter_needs_only_its_module_and_registry_line(tmp_path):
    (tmp_path / "grid.yaml").write_text("toy:\n  toy_knob: [3, 4]\n")
    p = subprocess.run([sys.executable, "-c", TOY, str(tmp_path / "grid.yaml")], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    help_text = " ".join(out["help"].split())
    assert "--toy-knob TOY_KNOB how toy the toy is (default: toy 7)" in help_text
    assert "toy" in help_text.split("--model MODEL", 1)[1].split("(default", 1)[0]
    assert out["knobs"] == [3, 4]
    assert out["resolved"]["toy_knob"] == 7
    assert out["small"] == [{"toy_knob": [1, 2]}]
    assert out["built"] == {"n_items": 5, "toy_knob": 3}
    assert out["refused"] == "--toy-knob 11: must be in 1..10"
    assert out["elsewhere"].startswith("--toy-knob 2: autorec does not take it (only toy do)")
    # a training option of its own: a flag naming the models it applies to, refused elsewhere in
    # the model's words, applied by its training policy, resumable and searchable as declared
    assert "--toy-pace {calm,brisk} how the toy trains (toy only) (default: calm)" in help_text
    assert out["pace_elsewhere"] == "--toy-pace brisk: autorec has no pace; only toy do"
    assert out["pace"] == "brisk" and out["pace_resumable"] and out["pace_searchable"]
