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
    check(TrainConfig(model="nce-autorec", mode="joint", **final))  # one phase, fixed --epochs
    check(TrainConfig(model="puresvd", **final))
