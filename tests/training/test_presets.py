"""--preset: a model's named settings (models/autorec/presets.py), applied under the flags given,
``auto`` chosen by the data's density."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from models.autorec.presets import SPARSE_BELOW
from models.hparams import DataShape
from models.registry import MODELS
from prepared.errors import UsageError
from training import train
from training.config import TrainConfig, check, data_shape, with_preset


def settings(**kw) -> dict:
    """A TrainConfig's fields as the parser gives them: every default, ``kw`` set."""
    return {**TrainConfig(data="/d").to_dict(), "batch_size": None, **kw}


def shape(density: float) -> DataShape:
    return DataShape(users=1000, items=10_000, positives=round(density * 1000 * 10_000))


def test_auto_picks_by_train_density_and_says_why():
    sparse, line = with_preset(settings(preset="auto"), frozenset(), shape(0.0006))  # Gowalla's
    assert sparse["preset"] == "sparse"
    assert (sparse["width"], sparse["lam"], sparse["pos_weight"]) == (500, 10.0, 10.0)
    assert line.startswith("preset sparse (train density 0.060%;")
    assert "--width 500 --lam 10 --pos-weight 10" in line
    dense, _ = with_preset(settings(preset="auto"), frozenset(), shape(0.021))  # ml-100k's
    assert dense["preset"] == "dense"
    assert (dense["start_from"], dense["lam"], dense["lr"]) == ("svd", 1000.0, 1e-4)
    # the boundary itself is dense; just under it, sparse
    assert with_preset(settings(preset="auto"), frozenset(), shape(SPARSE_BELOW))[0]["preset"] == "dense"
    assert with_preset(settings(preset="auto"), frozenset(),
                       shape(SPARSE_BELOW * 0.99))[0]["preset"] == "sparse"


def test_a_flag_given_beside_the_preset_wins_and_is_named():
    got, line = with_preset(settings(preset="sparse", width=1000), frozenset({"width", "preset"}),
                            None)
    assert got["width"] == 1000 and got["pos_weight"] == 10.0
    assert line.endswith("; kept as given: --width")
    # given equal to the default still counts as given (the parser says what was typed)
    got, _ = with_preset(settings(model="autorec", preset="dense"), frozenset({"start_from"}), None)
    assert got["start_from"] == "random" and got["lam"] == 1000.0
    # without the parser's record, a value other than its default counts as given
    got, _ = with_preset(settings(preset="dense", lam=30.0), None, None)
    assert got["lam"] == 30.0 and got["width"] == 500


def test_no_preset_changes_nothing():
    s = settings(width=7)
    assert with_preset(s, frozenset({"width"}), None) == (s, "")


def test_a_model_without_presets_or_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(UsageError, match=r"--preset sparse: bpr has no presets \(only autorec, "
                                         r"nce-autorec have\); drop the flag"):
        check(TrainConfig(data="/d", model="bpr", preset="sparse"))
    with pytest.raises(UsageError, match="ns-autorec has no presets"):
        with_preset(settings(model="ns-autorec", preset="auto"), frozenset(), shape(0.01))
    with pytest.raises(UsageError, match="--preset wide: nce-autorec has no such preset; choose "
                                         "auto or one of sparse, dense"):
        check(TrainConfig(data="/d", preset="wide"))


@pytest.mark.parametrize("model", [m for m, c in MODELS.items() if c.presets])
def test_every_preset_is_a_configuration_its_model_takes(model):
    """A preset's keys are flags and its values pass the model's own checks (a typo in a preset
    would otherwise surface as a failed run)."""
    fields = set(TrainConfig.__dataclass_fields__)
    for name, values in MODELS[model].presets.named.items():
        assert set(values) <= fields, (name, set(values) - fields)
        got, _ = with_preset(settings(model=model, preset=name), frozenset(), None)
        check(TrainConfig(**{**got, "batch_size": None}))


def test_the_command_line_and_its_config_file_are_what_was_given(tmp_path):
    """train.py applies the preset under what was typed, --config FILE's values included, names
    the run by it and records the name the preset resolved to."""
    prep = SimpleNamespace(dataset="toy", n_items=10_000, n_users=1000,
                           manifest={"counts": {"warm_users": 1000}},
                           pop_train=np.full(10_000, 2))  # 20k positives: density 0.2%
    parse = train.build_parser().parse_args
    cfg = train.config_from_args(parse(["--data", "/d", "--preset", "auto", "--lam=3"]), prep)
    assert (cfg.preset, cfg.lam, cfg.width, cfg.pos_weight) == ("sparse", 3.0, 500, 10.0)
    assert cfg.run_name.startswith("nce-autorec-sparse-toy-")
    path = tmp_path / "c.yaml"
    path.write_text("width: 200\npreset: dense\n")
    cfg = train.config_from_args(parse(["--data", "/d", "--config", str(path)]), prep)
    assert (cfg.preset, cfg.width, cfg.lam, cfg.start_from) == ("dense", 200, 1000.0, "svd")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # what a resume compares


def test_the_shape_is_the_warm_users_train_positives():
    prep = SimpleNamespace(n_items=4, n_users=5, manifest={"counts": {"warm_users": 3}},
                           pop_train=np.array([1, 0, 2, 3]))
    got = data_shape(prep)
    assert (got.users, got.items, got.positives) == (3, 4, 6)
    assert got.density == pytest.approx(6 / 12)
    older = SimpleNamespace(n_items=4, n_users=5, manifest={"counts": {"cold_users": 1}},
                            pop_train=np.array([1, 0, 2, 3]))
    assert data_shape(older).users == 4
