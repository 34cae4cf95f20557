"""The demo's ``--models``: which models `make demo` trains and compares, checked before anything
starts, and named in its results file when they are not the default three."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra.demo import MODELS, chosen_models, main, options_text


def test_models_are_a_comma_list_of_registered_names_labelled_as_the_demo_labels_them():
    assert chosen_models("nce-autorec,puresvd") == (("nce-autorec", "NCE-AutoRec"),
                                                    ("puresvd", "PureSVD"))
    assert chosen_models(" ease , nce-autorec") == (("ease", "ease"), ("nce-autorec", "NCE-AutoRec"))
    assert chosen_models(",".join(m for m, _ in MODELS)) == MODELS


@pytest.mark.parametrize("text, says", [("nce-autorec,pureSVD", "unknown model(s) pureSVD"),
                                        ("puresvd,puresvd", "a model named twice"),
                                        (" , ", "no model named")])
def test_a_bad_models_list_is_refused_before_the_stack_starts(text, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main(["--models", text, "--var", str(tmp_path / "var"),
              "--stack-state", str(tmp_path / "stack")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and says in err
    assert "give a comma list of autorec," in err and "(default nce-autorec,autorec,puresvd)" in err
    assert not (tmp_path / "stack").exists() and not (tmp_path / "var").exists()


def test_the_results_file_names_the_options_that_are_not_the_default():
    args = lambda **kw: SimpleNamespace(**{"epochs": None, "models": MODELS, **kw})
    assert options_text(args()) == ""
    assert options_text(args(epochs=2)) == " (--epochs 2)"
    assert options_text(args(epochs=2, models=chosen_models("puresvd"))) == \
        " (--epochs 2 --models puresvd)"


def test_an_evaluation_is_reused_only_for_the_same_models_and_newer_than_their_lists(tmp_path):
    import json
    import os

    from infra.demo import evaluation_is_current

    recs = {}
    for label in ("NCE-AutoRec", "PureSVD"):
        recs[label] = tmp_path / label
        recs[label].mkdir()
        (recs[label] / "_manifest.json").write_text("{}")
        os.utime(recs[label] / "_manifest.json", (1000, 1000))
    out = tmp_path / "eval"
    assert not evaluation_is_current(out, recs)  # nothing evaluated yet
    out.mkdir()
    rows = [{"label": label, "metric": "NDCG"} for label in recs]
    (out / "manifest.json").write_text(json.dumps({"rows": rows}))
    assert evaluation_is_current(out, recs)
    # another --models: fewer, or others, evaluate again
    assert not evaluation_is_current(out, {"PureSVD": recs["PureSVD"]})
    assert not evaluation_is_current(out, {**recs, "AutoRec": recs["PureSVD"]})
    os.utime(recs["PureSVD"] / "_manifest.json")  # lists written after the evaluation
    os.utime(out / "manifest.json", (2000, 2000))
    assert not evaluation_is_current(out, recs)
