"""docs/models.md's table of models is the registry's (``models.catalogue``): exactly the models in
``models.registry.MODELS``, each with the kind, engine and hyperparameter defaults its class
declares. Reads files only: no Spark, no Ray."""

from __future__ import annotations

import pytest

from models import catalogue
from models.hparams import HP
from models.registry import MODELS


def doc_rows() -> dict[str, list[str]]:
    """The rows of docs/models.md's generated table: model name -> its other cells."""
    text = catalogue.DOC.read_text()
    assert text.count(catalogue.BEGIN) == 1 and text.count(catalogue.END) == 1, (
        "docs/models.md lacks the models table's markers; see models/catalogue.py")
    inside = text.split(catalogue.BEGIN, 1)[1].split(catalogue.END, 1)[0].strip().splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in inside[2:]]
    return {c[0].strip("`"): c[1:] for c in cells}


def test_the_models_table_is_the_registrys():
    assert not catalogue.stale(), ("docs/models.md's models table differs from "
                                   "models.registry.MODELS: run python -m models.catalogue --write")


def test_the_table_lists_exactly_the_registered_models_as_their_classes_declare():
    rows = doc_rows()
    assert list(rows) == list(MODELS)
    for name, cls in MODELS.items():
        kind, where, hps, module = rows[name]
        assert kind == cls.kind, name
        assert where == catalogue.TRAINS_ON.get((cls.kind, cls.engine), cls.engine), name
        assert module == f"`{catalogue.module_path(cls)}`", name
        for hp_name, hp in cls.hyperparameters.items():
            flag = "--" + hp_name.replace("_", "-")
            said = (f"{flag} {catalogue.value_text(hp.default)}" if hp.default is not None
                    else f"`{flag}` unset")
            assert said in hps, (name, said)
        assert (hps == "none") == (not cls.hyperparameters), name


def test_a_new_model_reaches_the_table_by_its_registry_line_and_a_stale_table_is_caught(tmp_path):
    class Toy:
        name, kind, engine = "toy", "closed-form", "ray"
        hyperparameters = {"toy_knob": HP(7, "how toy"), "toy_lam": HP(None, "l2 (default: --lam)"),
                           "toy_rate": HP(1e-4, "a rate")}

    models = {**MODELS, "toy": Toy}
    last = catalogue.table(models)[-2]
    assert last == ("| `toy` | closed-form | one Ray task | `--toy-knob 7 --toy-rate 0.0001`, "
                    "`--toy-lam` unset (default: `--lam`) | `tests/models/test_catalogue.py` |")
    page = tmp_path / "models.md"
    page.write_text(catalogue.DOC.read_text())
    assert not catalogue.stale(page) and catalogue.stale(page, models)
    assert catalogue.main(["--check", "--doc", str(page)]) == 0
    page.write_text(catalogue.with_table(page.read_text(), catalogue.table(models)))
    assert not catalogue.stale(page, models) and catalogue.main(["--check", "--doc", str(page)]) == 1
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="no table markers"):
        catalogue.stale(page)
