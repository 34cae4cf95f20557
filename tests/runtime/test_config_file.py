"""--config FILE (issue 29): options from a YAML file, flags over it, one-line errors, and the
config.yaml every run writes read back to the same configuration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import experiment.run
import experiment.state
from experiment.plan import ExperimentConfig
from models.registry import MODELS
from prepared.errors import UsageError
from runtime.cli import add_config_file, add_options, config_key, option, strict_parser, values
from training import run_record, train
from training.config import TrainConfig, check


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def parsed(argv: list[str]) -> TrainConfig:
    return TrainConfig(**values(train.build_parser().parse_args(argv), TrainConfig))


def test_the_files_values_are_used_in_either_spelling(tmp_path):
    path = write(tmp_path, "data: /abs/ml-100k\nmodel: autorec\nlam-units: plain\nwidth: 64\n"
                           "lr: 1e-3\nuse_gpu: true\n")
    cfg = parsed(["--config", path])  # --data is required: the file gives it
    assert (cfg.data, cfg.model, cfg.lam_units, cfg.width, cfg.use_gpu) == \
        ("/abs/ml-100k", "autorec", "plain", 64, True)
    assert cfg.lr == 0.001  # YAML 1.1 reads 1e-3 as a string; the flag's type reads it as a number
    assert cfg.epochs == TrainConfig.__dataclass_fields__["epochs"].default  # the rest: defaults


def test_a_flag_overrides_the_file_wherever_it_stands(tmp_path):
    path = write(tmp_path, "data: /abs/d\nepochs: 5\nwidth: 64\n")
    assert parsed(["--epochs", "7", "--config", path]).epochs == 7
    assert parsed(["--config", path, "--epochs", "7", "--data", "/other"]).data == "/other"
    assert parsed(["--config", path, "--epochs", "7"]).width == 64


def test_a_required_flag_left_to_the_file_is_required_again_without_it(tmp_path, capsys):
    parser = train.build_parser()
    parser.parse_args(["--config", write(tmp_path, "data: /abs/d\n")])
    with pytest.raises(SystemExit):
        parser.parse_args([])  # the same parser: the file made --data optional for its parse only
    assert "the following arguments are required: --data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--config", write(tmp_path, "epochs: 3\n", "no-data.yaml")])
    assert "required: --data" in capsys.readouterr().err


@pytest.mark.parametrize("text, says", [
    ("data: d\nlamda: 3\n", "line 2: unknown option 'lamda'; did you mean lam? rename or remove it"),
    ("data: d\nlam-unit: plain\n", "line 2: unknown option 'lam-unit'; did you mean lam-units?"),
    ("epochs: 2.5\n", "line 1: epochs: expected an integer, got 2.5; write an integer"),
    ("lr: fast\n", "line 1: lr: expected a number, got 'fast'; write a number"),
    ("lam: .nan\n", "line 1: lam: expected a finite number, got nan; write one"),
    ("cpus_per_worker: .inf\n", "line 1: cpus_per_worker: expected a finite number, got inf"),
    ("use_gpu: 1\n", "line 1: use_gpu: expected true or false, got 1"),
    ("seed: null\n", "line 1: seed: expected an integer, got null"),
    ("run_name: 2026-01-01\n", "line 1: run_name: expected a string, got 2026-01-01; quote it"),
    ("model: wmf2\n", "line 1: model: 'wmf2' is not one of autorec, "),
    ("train_splits: valid\n", "line 1: train_splits: 'valid' is not one of train, train,valid"),
    ("mlflow_uri: http://x\n", "line 1: mlflow_uri is not part of a configuration file; pass "
                               "--mlflow-uri on the command line"),
    ("lam: 1\nlam-units: plain\nlam: 2\n", "line 3: lam is given twice (also on line 1)"),
    ("data: d\nwidth: [64\n", "not valid YAML at line 3, column 1"),
    ("data: d\n  width: 64\n", "not valid YAML at line 2, column 8"),
    ("- data\n- d\n", "holds a list, not a mapping of options; write one `option: value` a line"),
    ("just words\n", "holds a single value, not a mapping of options"),
])
def test_each_mistake_in_the_file_is_one_line_naming_the_file_and_the_fix(tmp_path, text, says):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as e:
        parsed(["--config", path])
    message = str(e.value)
    assert message.startswith(f"--config {path}") and "\n" not in message, message
    assert says in message, message


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(UsageError, match=r"^--config \S+absent\.yaml: no such file; check the path$"):
        parsed(["--config", str(tmp_path / "absent.yaml")])


@pytest.mark.parametrize("main", [train.main, experiment.run.main])
def test_the_clis_print_a_bad_file_as_one_error_line(main, tmp_path, capsys):
    path = write(tmp_path, "data: d\nepochz: 3\n")
    assert main(["--config", path]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"error: --config {path}, line 2: unknown option 'epochz'; did you mean epochs? rename or "
        "remove it (the options are --help's flags, without the leading dashes)"]


@pytest.mark.parametrize("build", [train.build_parser, experiment.run.build_parser])
def test_help_lists_config_file(build, tmp_path, capsys):
    assert "--config FILE" in " ".join(build().format_help().split())
    with pytest.raises(SystemExit) as e:  # --help needs no file, even a broken one
        build().parse_args(["--config", write(tmp_path, "nonsense: [\n"), "--help"])
    assert e.value.code == 0 and "--config FILE" in capsys.readouterr().out


@dataclass(frozen=True)
class _Listed:
    metrics: tuple[str, ...] = option(("ndcg",), help="metrics", choices=("ndcg", "map", "recall"))
    ks: tuple[int, ...] = option((5, 50), help="cut-offs")


def test_tuple_options_take_a_yaml_list_or_one_value(tmp_path):
    parser = strict_parser()
    add_options(parser, _Listed)
    add_config_file(parser, _Listed)
    path = write(tmp_path, "metrics: [map, ndcg]\nks: 10\n")
    got = _Listed(**values(parser.parse_args(["--config", path]), _Listed))
    assert got == _Listed(metrics=("map", "ndcg"), ks=(10,))
    with pytest.raises(UsageError, match=r"line 1: ks: expected a list of integers, got 'x'; "
                                         r"write an integer$"):
        parser.parse_args(["--config", write(tmp_path, "ks: [5, x]\n", "bad.yaml")])
    with pytest.raises(UsageError, match=r"metrics: 'mrr' is not one of ndcg, map, recall"):
        parser.parse_args(["--config", write(tmp_path, "metrics: [ndcg, mrr]\n", "bad2.yaml")])


# -- config.yaml: written by every run, read back by --config ------------------------------------

def a_run(**kw) -> TrainConfig:
    """A configuration as train.py resolves it (config_from_args), some options set."""
    return TrainConfig(**{"data": "/abs/ml-100k", "run_name": "nce-autorec-ml-100k-20260101",
                          "output": "/abs/runs", "experiment": "ml-100k", **kw})


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_runs_config_yaml_reads_back_to_the_configuration_it_ran(model, tmp_path):
    cfg = a_run(model=model, epochs=7, seed=4, valid_sample=0.5)
    text = run_record.config_file(cfg, "0123abcd")
    got = parsed(["--config", write(tmp_path, text)])
    # every option back, hyperparameters spelt out as resolved; not the run's name (a fed-back
    # file must start a new run)
    assert got == replace(TrainConfig(**run_record.resolved_config(cfg)), run_name="")
    assert got.resolved() == cfg.resolved()
    check(got)  # a resolved hyperparameter is one the model takes
    data = yaml.safe_load(text)
    assert "run_name" not in data and "mlflow_uri" not in data
    for name, value in cfg.resolved().items():
        assert data[name] == value, name  # the value the run used, not None
    assert f"run {cfg.run_name} (MLflow run 0123abcd)" in text.splitlines()[0]
    assert f"add --run-name {cfg.run_name} to resume that run" in text


def test_a_fed_back_file_starts_a_new_run_and_resumes_with_its_name(tmp_path):
    cfg = a_run(model="nce-autorec", mode="limited-finetune", pretrain_epochs=2)
    path = write(tmp_path, run_record.config_file(cfg))
    prep = SimpleNamespace(dataset="ml-100k")
    fresh = train.config_from_args(train.build_parser().parse_args(["--config", path]), prep)
    assert fresh.run_name != cfg.run_name and fresh.run_name.startswith("nce-autorec-limited-finetune")
    record = {"config": cfg.to_dict()}  # run.json holds the options as given (None = default)
    again = train.config_from_args(
        train.build_parser().parse_args(["--config", path, "--run-name", cfg.run_name]), prep)
    run_record.check_resume(again, record)  # the same run spelt out: resumes
    changed = train.config_from_args(train.build_parser().parse_args(
        ["--config", path, "--run-name", cfg.run_name, "--lam", "4"]), prep)
    with pytest.raises(UsageError, match="lam was None, now 4.0"):
        run_record.check_resume(changed, record)
    # and the other way round: a run started from the file resumes with the plain flags
    run_record.check_resume(cfg, {"config": again.to_dict()})


def test_an_experiments_config_yaml_reads_back_to_its_configuration(tmp_path):
    cfg = ExperimentConfig(data="/abs/ml-100k", models="autorec,ease", grid="paper", name="mine",
                           output="/abs/experiments", patience=3, valid_by="trained",
                           no_register=True)
    text = experiment.state.config_file(cfg, "r1")
    path = write(tmp_path, text)
    got = ExperimentConfig(**values(experiment.run.build_parser().parse_args(["--config", path]),
                                    ExperimentConfig))
    assert got == cfg
    assert "configuration of experiment mine (MLflow run r1)" in text.splitlines()[0]
    # keyed as --help names the flags (--experiments-dir holds the field ``output``)
    assert set(yaml.safe_load(text)) == {config_key(f) for f in dataclasses.fields(ExperimentConfig)}


def test_the_experiments_run_logs_its_config_yaml(tmp_path):
    """Against a real MLflow store (SQLite in tmp_path): the experiment's run holds config.yaml,
    and it reads back to the experiment's configuration."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = ExperimentConfig(data="/abs/ml-100k", models="autorec", name="logged",
                           output=str(tmp_path / "experiments"))
    state = {"models": {}}
    experiment.state.parent_runs(uri, cfg, state, ["autorec"], "ml-100k")
    client = MlflowClient(uri)
    assert "config.yaml" in {a.path for a in client.list_artifacts(state["run_id"])}
    local = client.download_artifacts(state["run_id"], "config.yaml", str(tmp_path))
    got = ExperimentConfig(**values(experiment.run.build_parser().parse_args(["--config", local]),
                                    ExperimentConfig))
    assert got == cfg
