"""The ETL's command line, as users run it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def test_help_lists_flags_and_dataset_defaults():
    out = subprocess.run([PY, "etl/prepare.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--dataset", "--input", "--output", "--seed", "--overwrite", "--cold-users",
                 "--beta", "--negatives", "--max-bad-rows", "--positive", "--split"):
        assert flag in out.stdout
    assert "yahoo-r1" in out.stdout and "80..100" in out.stdout


def test_usage_error_is_one_line_without_traceback(tmp_path):
    out = subprocess.run([PY, "etl/prepare.py", "--dataset", "ml-100k", "--input",
                          str(tmp_path / "missing.data"), "--output", str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "missing.data: no such file; check --input" in out.stderr
    assert "Traceback" not in out.stderr


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if int(p, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


@pytest.mark.spark
def test_local_spark_binds_driver_and_ui_to_loopback(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert conf.get("spark.driver.host") == "127.0.0.1"
    ui_port = int(spark.sparkContext.uiWebUrl.rsplit(":", 1)[1])
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, as IPv4 or mapped IPv6
    assert listening_addresses(ui_port) and listening_addresses(ui_port) <= loopback  # not 0.0.0.0/::


@pytest.mark.spark
def test_a_long_spark_action_logs_its_progress(spark, caplog, tmp_path):
    """The action's tasks wait until the heartbeat has spoken of their stage (a marker file the
    log handler writes): the test waits on that line, not on a guess of how long it takes."""
    import logging

    from runtime.spark import heartbeat

    marker = tmp_path / "heard"

    class Heard(logging.Handler):
        def emit(self, record):
            if "tasks of 1 active stage(s)" in record.getMessage():
                marker.touch()

    def wait_for_marker(x, path=str(marker)):
        import os
        import time
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        return x

    log = logging.getLogger("etl")
    heard = Heard()
    log.addHandler(heard)
    try:
        with caplog.at_level(logging.INFO, "etl"), heartbeat(spark, "slow count", log, every=0.3):
            spark.sparkContext.parallelize(range(4), 4).map(wait_for_marker).count()
    finally:
        log.removeHandler(heard)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("slow count: ")]
    assert marker.exists() and any("tasks of 1 active stage(s)" in ln for ln in lines), lines


def test_loopback_settings_leave_what_the_user_configured(monkeypatch):
    from runtime.spark import loopback_conf

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # as under spark-submit
    assert loopback_conf("spark://master:7077", {}) == {}  # executors elsewhere must reach it
    assert loopback_conf("local[2]", {"spark.driver.host": "10.0.0.5"}) == {
        "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false"}
    assert loopback_conf("local[*]", {"spark.ui.enabled": "true"}) == {
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.2")
    assert loopback_conf("local", {}) == {"spark.driver.bindAddress": "127.0.0.2",
                                          "spark.driver.host": "127.0.0.2"}


# -- every command line is built from its config dataclass --------------------------------------

CLIS = [("etl.prepare", "ETLConfig", "etl.config", ["--dataset", "ml-100k", "--output", "o",
                                                     "--input", "u.data"]),
        ("training.train", "TrainConfig", "training.config", ["--data", "d"]),
        ("evaluation.score", "ScoreConfig", "evaluation.score", ["--model", "m", "--data", "d",
                                                                 "--output", "o"]),
        ("evaluation.evaluate", "EvaluateConfig", "evaluation.evaluate",
         ["--recs", "r", "--data", "d", "--output", "o"]),
        ("experiment.run", "ExperimentConfig", "experiment.plan", ["--data", "d"]),
        ("experiment.ensemble", "EnsembleConfig", "experiment.ensemble",
         ["--members", "m", "--data", "d", "--run-name", "n"])]


@pytest.mark.parametrize("cli, cls_name, where, required", CLIS)
def test_each_cli_takes_its_defaults_from_its_config(cli, cls_name, where, required):
    import dataclasses
    import importlib

    from runtime.cli import values

    cls = getattr(importlib.import_module(where), cls_name)
    args = importlib.import_module(cli).build_parser().parse_args(required)
    got = values(args, cls)
    for f in dataclasses.fields(cls):
        given = f"--{f.name.replace('_', '-')}" in required
        if "help" not in f.metadata or given or f.default is dataclasses.MISSING and \
                f.default_factory is dataclasses.MISSING:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert got[f.name] == default, f.name  # no second copy of a default in the parser


@pytest.mark.parametrize("argv, message", [
    (["--data", "d", "--epoch", "3"], "unrecognized arguments: --epoch 3"),  # no prefix guessing
    (["--data", "d", "--lamda", "3"], "unrecognized arguments: --lamda"),
    (["--data", "d", "--model", "wmf"], "argument --model: invalid choice: 'wmf' (choose from "
                                         "'autorec', 'ohns-autorec'"),
])
def test_train_cli_is_strict(argv, message, capsys):
    from training.train import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--lam", "nan"), ("--pos-weight", "inf"),
                                         ("--dropout", "NaN"), ("--cpus-per-worker", "-inf"),
                                         ("--valid-sample", "nan")])
def test_no_float_flag_takes_nan_or_an_infinity(flag, value, capsys):
    """Every float flag of every CLI (the shared layer's type): NaN passes any range check
    after it (``--lam nan`` trained an epoch, then advised raising --lam "(now nan)")."""
    from training.train import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--data", "d", f"{flag}={value}"])  # =: -inf is no flag
    assert f"argument {flag}: want a finite number, got {value}" in capsys.readouterr().err


def test_a_float_flag_still_says_a_word_is_no_number(capsys):
    from etl.prepare import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["--dataset", "ml-100k", "--beta", "high"])
    assert "argument --beta: invalid float value: 'high'" in capsys.readouterr().err




def test_a_model_refuses_a_flag_it_does_not_take_in_one_line(tmp_path):
    out = subprocess.run([PY, "training/train.py", "--data", str(tmp_path), "--model", "ease",
                          "--width", "100"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: --width 100: ease does not take it (only autorec, ohns-autorec, ns-autorec, "
        "nce-autorec, bpr, cml, cdae, vae-cf do); its hyperparameters: --lam. Drop the flag"]


@pytest.mark.parametrize("script", ["training/train.py", "experiment/run.py"])
def test_a_job_server_address_is_refused_before_anything_runs(script, tmp_path):
    """The stack's exports set RAY_ADDRESS to the job server (http://...) for `ray job submit`;
    a driver run directly in that shell is told which address it needs, not given Ray's traceback
    (and nothing is read: --data does not exist)."""
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:8265"}
    out = subprocess.run([PY, script, "--data", str(tmp_path / "absent")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: RAY_ADDRESS=http://127.0.0.1:8265 is a Ray job server's")
    assert "--ray-address HOST:6379" in line and "unset RAY_ADDRESS" in line


def test_the_ray_address_a_driver_joins(monkeypatch):
    from prepared.errors import UsageError
    from runtime.raycluster import join_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert join_address(None) is None  # a local Ray
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert join_address(None) == "10.0.0.5:6379"
    assert join_address("127.0.0.1:6379") == "127.0.0.1:6379"  # the flag wins
    with pytest.raises(UsageError, match=r"^--ray-address=https://head:8265 is a Ray job server"):
        join_address("https://head:8265")


# -- --version, help text and messages (issue 29, CLI polish) -------------------------------------

ENTRY_POINTS = [["etl/prepare.py"], ["training/train.py"], ["experiment/run.py"],
                ["evaluation/score.py"], ["evaluation/evaluate.py"], ["-m", "etl.fetch"],
                ["-m", "infra.demo"], ["-m", "infra.stack"], ["-m", "etl.verify"],
                ["-m", "infra.screenshots"]]


def test_every_entry_point_prints_its_version():
    from importlib.metadata import version

    # all at once: train.py alone spends seconds importing torch and Ray
    procs = [subprocess.Popen([PY, *cmd, "--version"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for cmd in ENTRY_POINTS]
    for cmd, p in zip(ENTRY_POINTS, procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, (cmd, err[-2000:])
        # another commit may land in this checkout meanwhile: the form, not that very sha
        assert re.fullmatch(rf"nce-autorec {re.escape(version('nce-autorec'))} \(git [0-9a-f]{{7,}}\)",
                            out.strip()), (cmd, out)


def test_a_mistyped_flag_gets_one_line_the_flags_it_meant_and_no_usage(capsys):
    from training.train import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--data", "d", "--epoch", "3", "--lamda=2", "--zzz"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "training/train.py: error: unrecognized arguments: --epoch 3 --lamda=2 --zzz",
        "  --epoch: did you mean --epochs?",
        "  --lamda: did you mean --lam?",  # --zzz is near no flag: nothing guessed
        "(`training/train.py --help` lists every flag)"]


@pytest.mark.parametrize("module, argv, message", [
    ("infra.demo", ["--vra", "x"], "--vra: did you mean --var?"),
    ("infra.stack", ["start", "--ray-prt", "1"], "--ray-prt: did you mean --ray-port?"),
    # no prefix guessing: argparse's default reads --stat as --state (harmless with status)
    ("infra.stack", ["status", "--stat", "/nonexistent"], "unrecognized arguments: --stat"),
    ("etl.fetch", ["--lst"], "--lst: did you mean --list?"),
    ("etl.verify", ["/nonexistent", "--verison"], "--verison: did you mean --version?"),
    # the missing DIR is argparse's first error; the mistyped flag still gets its guess
    ("etl.verify", ["--hel"], "--hel: did you mean --help?"),
])
def test_the_tools_parse_flags_as_the_stages_do(module, argv, message, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err


def test_the_screenshots_say_what_to_install_and_what_to_run_first(monkeypatch, tmp_path):
    from infra import screenshots

    monkeypatch.setitem(sys.modules, "playwright", None)  # not installed
    with pytest.raises(SystemExit, match=r"pip install playwright .*apt-get install chromium"):
        screenshots.main([])
    monkeypatch.delitem(sys.modules, "playwright")
    monkeypatch.setitem(sys.modules, "playwright", type(sys)("playwright"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(screenshots.stack, "STATE", tmp_path / "no-stack")
    with pytest.raises(SystemExit, match=r"no local stack running: `make demo`"):
        screenshots.main([])


def test_version_without_git_is_the_package_version_alone(monkeypatch):
    from runtime import cli

    def no_git(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(cli.subprocess, "run", no_git)
    from importlib.metadata import version

    assert cli.version_text() == f"nce-autorec {version('nce-autorec')}"


def test_a_refused_hyperparameter_names_the_flags_as_typed():
    from prepared.errors import UsageError
    from training.config import TrainConfig, check

    with pytest.raises(UsageError) as e:
        check(TrainConfig(data="d", model="autorec", rank=5))
    assert str(e.value) == ("--rank 5: autorec does not take it (only puresvd, nce-plrec, wrmf do); "
                            "its hyperparameters: --width, --lam, --lam-units, "  # not --lam_units
                            "--dropout, --pos-weight, --emphasis, --pop-l2, --predict-loss. "
                            "Drop the flag")


def test_an_unreachable_tracking_server_names_a_real_make_target():
    from prepared.errors import UsageError
    from runtime.tracking import check_reachable

    with pytest.raises(UsageError) as e:
        check_reachable("http://127.0.0.1:9", timeout=2)  # discard port: nothing listens
    message = str(e.value)
    assert "make stack" in message and "make mlflow" not in message
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    assert set(re.findall(r"make ([a-z][a-z-]*)", message)) <= targets


def _actions(parser) -> dict:
    """Each destination's flag as --help shows it (a renamed flag's old name, also stored there,
    is off --help)."""
    out: dict = {}
    for a in parser._actions:
        out.setdefault(a.dest, a)
    return out


@pytest.mark.parametrize("cli, cls_name, where, required", CLIS)
def test_help_shows_every_default(cli, cls_name, where, required):
    """Including 0 and False, which a truthiness test used to hide."""
    import argparse
    import dataclasses
    import importlib

    cls = getattr(importlib.import_module(where), cls_name)
    actions = _actions(importlib.import_module(cli).build_parser())
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata or f.metadata["hidden"] or actions[f.name].required:
            continue
        assert actions[f.name].help != argparse.SUPPRESS and "default" in actions[f.name].help, f.name


def test_zero_and_off_defaults_read_as_such():
    from training.train import build_parser

    actions = _actions(build_parser())
    assert actions["seed"].help.endswith("(default: 0)")
    assert actions["pretrain_epochs"].help.endswith("(default: 0)")
    assert actions["use_gpu"].help.endswith("(default: off)")


def test_a_choice_holding_a_comma_reads_as_one_choice():
    from training.train import build_parser

    usage = " ".join(build_parser().format_help().split())
    assert "--train-splits {train|train,valid}" in usage
    assert "{train,train,valid}" not in usage


@pytest.mark.parametrize("flag, field", [("lam", "lam"), ("width", "width"), ("rank", "rank"),
                                         ("lr", "learning_rate"), ("patience", "patience"),
                                         ("batch_size", "batch_size")])
def test_per_model_defaults_in_help_name_each_model(flag, field):
    """From the models' own classes: the help cannot drift from models/*.py."""
    from models.registry import MODELS
    from training.train import build_parser

    text = " ".join(_actions(build_parser())[flag].help.split())
    listed = text[text.rindex("(") + 1:text.rindex(")")]
    listed = listed.removeprefix("default: ").removeprefix("the model's own, ")
    got = dict(pair.rsplit(" ", 1) for pair in listed.split(", "))
    want = {}
    for name, cls in MODELS.items():
        trainer = field in ("learning_rate", "patience", "batch_size")  # the training policy's
        value = getattr(cls.trainer, field) if trainer else cls.defaults().get(field)
        if value is not None and (not trainer or cls.kind == "gradient"):
            want[name] = value
    assert want and {m: float(v) for m, v in got.items()} == {m: float(v) for m, v in want.items()}
    if flag == "lam":
        assert "autorec 3, ohns-autorec 2, ns-autorec 10, nce-autorec 10" in text
        assert "AutoRec family 3" not in text


def test_the_batch_size_not_given_is_the_models_own_and_a_given_one_wins():
    """Resolved when the config is made: the loop, the records and a resume see the number."""
    from models.registry import MODELS
    from training.config import TrainConfig

    for name, cls in MODELS.items():
        assert TrainConfig(data="d", model=name).batch_size == cls.trainer.batch_size
        assert TrainConfig(data="d", model=name, batch_size=7).batch_size == 7
    assert MODELS["bpr"].trainer.batch_size == 128  # the models outside the family keep theirs


def test_a_run_logs_only_the_parameters_its_model_takes():
    """MLflow's parameters of a run: every model's own hyperparameters with their defaults, the
    run's settings; not another model's (as None), nor Adam's for a closed form."""
    from models.registry import MODELS
    from training.config import TrainConfig

    for name, cls in MODELS.items():
        params = TrainConfig(data="d", model=name).logged_params()
        assert {k: params[k] for k in cls.defaults()} == cls.defaults(), name
        # None only where the model's own default is None (embed_lam: "lam's")
        assert not [k for k, v in params.items() if v is None and k not in cls.defaults()], name
        assert {"data", "model", "seed", "num_workers", "train_splits"} <= set(params), name
        others = {k for c in MODELS.values() for k in c.defaults()} - set(cls.defaults())
        assert not others & set(params), (name, others & set(params))
        gradient = cls.kind == "gradient"
        assert ("lr" in params and "epochs" in params) == gradient, name
    nce = TrainConfig(data="d", model="nce-autorec", lr=0.01, width=64).logged_params()
    assert (nce["lr"], nce["width"], nce["model"]) == (0.01, 64, "nce-autorec")
    assert nce["loss_path"] == "auto"  # the family's own training option, at its default
    limited = TrainConfig(data="d", model="nce-autorec", mode="limited-finetune").logged_params()
    assert limited["finetune_init"] == "ridge"
    svd = TrainConfig(data="d", model="puresvd").logged_params()
    assert "rank" in svd and not {"width", "margin", "kl_cap", "lr", "batch_size"} & set(svd)


@pytest.mark.parametrize("cli, flag, says", [
    ("etl.prepare", "--output", "itself"), ("evaluation.score", "--output", "itself"),
    ("evaluation.evaluate", "--output", "itself"),
    ("training.train", "--runs-dir", "the folder of runs: this one goes to RUNS_DIR/RUN_NAME"),
    ("experiment.run", "--experiments-dir",
     "the folder of experiments: this one goes to EXPERIMENTS_DIR/NAME")])
def test_output_is_always_the_folder_itself_and_a_folder_of_many_says_so(cli, flag, says):
    """--output means the output folder itself wherever it appears; training and the experiment,
    which put each run under a folder of many, name that flag for what it is."""
    import importlib

    action = _actions(importlib.import_module(cli).build_parser())["output"]
    assert action.option_strings[0] == flag and says in action.help


def test_score_pairs_each_model_with_its_output_and_refuses_a_mismatch():
    from evaluation.score import build_parser, jobs
    from prepared.errors import UsageError

    parse = build_parser().parse_args
    todo = jobs(parse(["--model", "m1", "m2", "--output", "o1", "o2", "--data", "d", "--k", "5"]))
    assert [(j["model"], j["output"], j["k"], j["data"]) for j in todo] == \
        [("m1", "o1", 5, "d"), ("m2", "o2", 5, "d")]
    assert jobs(parse(["--model", "m", "--output", "o", "--data", "d"]))[0]["model"] == "m"
    with pytest.raises(UsageError, match="names 2 models but --output 1 directory: give one"):
        jobs(parse(["--model", "m1", "m2", "--output", "o1", "--data", "d"]))
    with pytest.raises(UsageError, match="names one directory twice"):
        jobs(parse(["--model", "m1", "m2", "--output", "o", "o", "--data", "d"]))
