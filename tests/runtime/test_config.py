import pytest

from etl.config import ETLConfig, PositiveRule, dataset_name
from prepared.errors import UsageError


@pytest.mark.parametrize("text, rating, positive", [
    (">3", 3.0, False), (">3", 3.5, True), (">=3", 3.0, True), ("80..100", 79, False),
    ("80..100", 80, True), ("80..100", 100, True), ("80..100", 255, False), ("all", None, True),
    ("<2", 1.0, True), ("<=2", 2.0, True), ("<2", 2.0, False),
])
def test_positive_rules(text, rating, positive):
    r = PositiveRule.parse(text)
    if r.all_rows:
        assert positive
        return
    ok = True
    if r.low is not None:
        ok &= rating >= r.low if r.low_inclusive else rating > r.low
    if r.high is not None:
        ok &= rating <= r.high if r.high_inclusive else rating < r.high
    assert ok == positive
    assert PositiveRule.parse(str(r)) == r  # the printed rule reads back the same


def test_bad_rule_says_what_to_write():
    with pytest.raises(UsageError, match="'>3'"):
        PositiveRule.parse("more than 3")


def test_dataset_aliases_and_unknown_names():
    assert dataset_name("yahoo") == "yahoo-r1"
    with pytest.raises(UsageError, match="ml-100k"):
        dataset_name("movielens")


@pytest.mark.parametrize("kwargs, match", [
    (dict(cold_users=1.0), "cold-users"), (dict(test_fraction=0.6), "must not exceed"),
    (dict(beta=-1), "beta"), (dict(negatives=-5), "negatives"), (dict(input=()), "--input"),
])
def test_config_rejects_out_of_range(kwargs, match):
    base = dict(dataset="ml-100k", output="/tmp/x", input=("u.data",))
    with pytest.raises(UsageError, match=match):
        ETLConfig(**{**base, **kwargs})


def test_protocol_defaults_per_dataset():
    cfg = ETLConfig(dataset="goodbooks", output="/tmp/x", input=("r.csv",))
    assert (cfg.positive_rule, cfg.split_mode) == (">=3", "random")
    cfg = ETLConfig(dataset="yahoo-r1", output="/tmp/x", input=("y.txt",), split="time")
    assert (cfg.positive_rule, cfg.split_mode) == ("80..100", "time")


def test_every_file_layout_has_a_reader_and_every_dataset_a_registered_layout():
    """The layout registry replaces format-name comparisons: a layout that reads files has one
    reader, a generated one has none, and no dataset names a layout outside the registry."""
    from etl.config import DATASETS, LAYOUTS
    from etl.sources import READERS

    assert set(READERS) == {n for n, layout in LAYOUTS.items() if not layout.generated}
    assert all(spec.layout is LAYOUTS[spec.layout.name] for spec in DATASETS.values())
    assert [n for n, layout in LAYOUTS.items() if layout.generated] == ["synthetic"]
    assert DATASETS["yahoo-r1"].layout.rating_255 and DATASETS["citeulike"].layout.one_file
    assert DATASETS["csv"].layout.named_columns and not DATASETS["ml-100k"].layout.named_columns


def test_a_final_retraining_needs_phase_ones_length_where_the_model_converges_it():
    """The rule is the model's (``Recommender.converges_a_phase``): the AutoRec family's
    fine-tune modes run phase 1 until its loss converges, which needs a validation split."""
    from training.config import TrainConfig, check

    final = dict(data="d", train_splits="train,valid")
    with pytest.raises(UsageError, match="pretrain-epochs.*no validation set to detect convergence"):
        check(TrainConfig(model="nce-autorec", mode="limited-finetune", **final))
    check(TrainConfig(model="nce-autorec", mode="limited-finetune", pretrain_epochs=40, **final))
    # phase 1's own length (--finetune-phase1-epochs) is a count too: nothing to converge
    check(TrainConfig(model="nce-autorec", mode="full-finetune", finetune_phase1_epochs=5, **final))
    check(TrainConfig(model="nce-autorec", mode="joint", **final))  # one phase, fixed --epochs
    check(TrainConfig(model="puresvd", **final))


@pytest.mark.parametrize("flags,said", [
    ({"model": "puresvd", "pos_weight": 2.0},
     "--pos-weight 2.0: puresvd does not take it (only autorec, ns-autorec, nce-autorec do)"),
    ({"model": "ohns-autorec", "pos_weight": 2.0}, "--pos-weight 2.0: ohns-autorec does not take"),
    ({"model": "autorec", "nce_scale": "rms"}, "--nce-scale rms: autorec does not take it"),
    ({"model": "puresvd", "dropout": 0.2}, "--dropout 0.2: puresvd does not take it"),
    ({"model": "nce-autorec", "dropout": 1.0}, "--dropout 1.0: must be in [0, 1)"),
    ({"model": "nce-autorec", "finetune_phase1_epochs": 5},
     "--finetune-phase1-epochs 5: sets phase 1 of --mode limited-finetune or full-finetune"),
    ({"model": "autorec", "finetune_phase1_lr": 1e-3},
     "--finetune-phase1-lr 0.001: sets phase 1 of --mode"),
    ({"model": "nce-autorec", "mode": "limited-finetune", "pos_weight": 2.0,
      "finetune_init": "ridge"}, "--finetune-init ridge with --pos-weight 2: the ridge start"),
    ({"model": "nce-autorec", "mode": "full-finetune", "dropout": 0.5, "emphasis": 4.0,
      "finetune_init": "ridge"}, "--finetune-init ridge with --emphasis 4: the ridge start"),
    ({"model": "ohns-autorec", "emphasis": 4.0}, "--emphasis 4.0: ohns-autorec does not take"),
])
def test_a_lever_a_model_does_not_take_is_refused_in_one_line(flags, said):
    from prepared.errors import UsageError
    from training.config import TrainConfig, check

    with pytest.raises(UsageError) as e:
        check(TrainConfig(data="d", **flags))
    assert str(e.value).startswith(said) and "\n" not in str(e.value)


def test_the_levers_are_accepted_and_searchable():
    from experiment.grids import SEARCHABLE
    from training.config import TrainConfig, check

    check(TrainConfig(data="d", model="nce-autorec", mode="full-finetune", pos_weight=5.0,
                      dropout=0.3, nce_scale="head-weight", finetune_phase1_epochs=20,
                      finetune_phase1_lr=1e-3))
    check(TrainConfig(data="d", model="autorec", pos_weight=1.0, dropout=0.5))
    assert {"pos_weight", "dropout", "nce_scale", "finetune_phase1_epochs",
            "finetune_phase1_lr"} <= SEARCHABLE
    resolved = TrainConfig(data="d", model="nce-autorec", mode="limited-finetune",
                           pos_weight=5.0).resolved()
    assert resolved["finetune_init"] == "as-is" and resolved["finetune_phase1_epochs"] == 0
