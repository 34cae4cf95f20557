"""benchmarks/probe.py's metrics against values by hand."""

import math

import numpy as np
import pytest
import torch

from benchmarks import probe
from training.feed import ValidBatch


def test_recall_and_truncated_ndcg_at_k_by_hand():
    """k = 5. User 1: truth {1, 2}, list (1, 9, 2, 7, 8): recall 1, NDCG (1 + 1/log2 4) /
    (1 + 1/log2 3). User 2: truth of 6 items, list (6, 0, 3, 4, 12): recall 1/6, NDCG 1 / the
    ideal over min(6, 5) = 5 ranks."""
    ideal = lambda n: sum(1 / math.log2(j + 1) for j in range(1, n + 1))
    recall, ndcg = probe.at_k(np.array([[1, 9, 2, 7, 8], [6, 0, 3, 4, 12]]),
                              [{1, 2}, {5, 6, 7, 8, 10, 11}], k=5)
    assert recall == pytest.approx((1 + 1 / 6) / 2)
    assert ndcg == pytest.approx(((1 + 0.5) / ideal(2) + 1 / ideal(5)) / 2)


class ByInput:
    """A stand-in model whose top-k is each user's first input item + 10, then 0, 1, ...: the
    lists follow from the rows, so the blocks' offsets are checked too."""

    def recommend(self, items, offsets, k):
        first = items[offsets] + 10
        rest = torch.arange(k - 1).expand(len(offsets), k - 1)
        return None, torch.cat([first[:, None], rest], 1)


def test_valid_metrics_score_every_user_across_blocks(monkeypatch):
    monkeypatch.setattr(probe, "BLOCK", 2)  # three users: two blocks
    valid = ValidBatch(train_items=torch.tensor([3, 4, 5, 6, 7]),
                       train_offsets=torch.tensor([0, 2, 3]),
                       valid_items=torch.tensor([13, 15, 0, 99]),
                       valid_offsets=torch.tensor([0, 1, 3]))
    # lists (13, 0, 1, 2, 3), (15, 0, 1, 2, 3), (16, 0, 1, 2, 3); truths {13}, {15, 0}, {99}
    recall, ndcg = probe.valid_metrics(ByInput(), valid, k=5)
    assert recall == pytest.approx((1 + 1 + 0) / 3)
    assert ndcg == pytest.approx((1 + 1 + 0) / 3)


def test_settings_are_key_value_pairs():
    assert probe.parse(["width=500", "model=autorec", "dropout=0.5"]) == {
        "width": 500, "model": "autorec", "dropout": 0.5}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        probe.parse(["width"])


def test_a_closed_form_is_fitted_in_process_and_validated_as_its_run_would(small_prepared, tmp_path,
                                                                           capsys):
    """model=ease: fitted here on the train split; the line's validation NDCG is
    training.closed_form's on the same model, and its Recall@20 probe's own metric of it."""
    import json

    from benchmarks.tune_defaults import load
    from models.registry import build
    from training.closed_form import matrices, validate
    from training.config import TrainConfig

    out = tmp_path / "probes.jsonl"
    assert probe.main(["--data", str(small_prepared), "model=ease", "lam=200",
                       "--out", str(out)]) == 0
    line = json.loads(out.read_text())
    assert line["settings"] == {"model": "ease", "lam": 200} and line["epochs"] == 1
    prep, rows, valid = load(str(small_prepared))
    cfg = TrainConfig(data=str(small_prepared), model="ease", lam=200.0)
    model = build("ease", {"n_items": prep.n_items, "lam": 200.0})
    model.fit(*matrices(prep, cfg, rows))
    ndcg, _, _ = validate(model.eval(), rows, cfg.valid_sample)
    assert line["best_valid_ndcg"] == round(ndcg, 4) > 0
    recall, ndcg20 = probe.valid_metrics(model, valid)
    assert (line["valid_recall@20"], line["valid_ndcg@20"]) == (round(recall, 4), round(ndcg20, 4))
    with pytest.raises(SystemExit, match="wrmf.*fits on Spark.*experiment/run.py"):
        probe.main(["--data", str(small_prepared), "model=wrmf"])


def test_a_probe_takes_the_statistics_its_settings_need(small_prepared):
    """--nce-scale rms needs mean(R*^2) at the run's beta: train_one asks the training policy
    with the run's config, as train.py does (it once asked without, and the model refused)."""
    from benchmarks.tune_defaults import load, train_one
    from models.autorec.training import NCETraining
    from training.config import TrainConfig

    prep, rows, valid = load(str(small_prepared))
    cfg = TrainConfig(data=str(small_prepared), model="nce-autorec", width=16, epochs=1,
                      nce_scale="rms", beta=0.8)
    net = train_one(cfg, prep, rows, valid)["net"]
    want = NCETraining.data_statistics(prep, "train", cfg)["rstar_mean_square"]
    assert net.rstar_mean_square == pytest.approx(want) and want > 0
    other = NCETraining.data_statistics(prep, "train", TrainConfig(
        data=str(small_prepared), model="nce-autorec", nce_scale="rms", beta=1.0))
    assert other["rstar_mean_square"] != pytest.approx(want)  # the run's beta, not a default


def test_a_probe_applies_a_preset_under_its_settings_and_saves_its_model(small_prepared, tmp_path):
    """preset=sparse sets what the settings leave (--pos-weight 10, --lam 10) and not what they
    give (width 16), as train.py does; --save writes the model (its best epoch's weights: here
    the one epoch) loadable as scoring loads a run's model.pt, with the splits it trained on,
    scoring as the probe's model did."""
    import json

    from models.registry import load_model_file

    out, saved = tmp_path / "probes.jsonl", tmp_path / "model.pt"
    assert probe.main(["--data", str(small_prepared), "model=nce-autorec", "preset=sparse",
                       "width=16", "epochs=1", "--out", str(out), "--save", str(saved)]) == 0
    line = json.loads(out.read_text())
    assert line["preset"].startswith("preset sparse: --lam 10 --pos-weight 10; kept as given: --width")
    model = load_model_file(str(saved))
    assert (model.width, model.lam, model.pos_weight) == (16, 10.0, 10.0)
    _, rows, valid = probe.load(str(small_prepared))
    recall, ndcg = probe.valid_metrics(model, valid)
    assert (line["valid_recall@20"], line["valid_ndcg@20"]) == (round(recall, 4), round(ndcg, 4))
    assert isinstance(torch.load(saved, weights_only=True), dict)  # plain data: weights-only
    from evaluation.model_source import from_checkpoint

    assert from_checkpoint(str(saved)).train_splits == "train"  # scoring's input: train only
