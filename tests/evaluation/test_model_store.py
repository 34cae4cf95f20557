"""Models from the tracking server: loading never runs stored code, and the logged pyfunc is one a
service can call with the dataset's own item ids (models/serving.py, evaluation/model_source.py).

The malicious models are real: a cloudpickled pyfunc whose unpickling runs ``os.system`` and a
models-from-code file that runs it on import, each logged to the session's MLflow server and
registered under an alias. Scoring refuses both in one line and the marker never appears; MLflow's
own loader, run at the end, does create it (so the test would fail on a loader that runs code)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models import serving
from models.registry import build
from prepared.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


# ---- the request contract, without MLflow ------------------------------------------------------

IDS = serving.ItemIds(["10", "20", "30", "40"])


def parse(frame: dict, params=None):
    return serving.parse(pd.DataFrame(frame), 4, IDS, params)


def test_ids_map_to_indices_unknown_ones_refused_or_counted_and_ints_read_as_text():
    rows, unknown, k, seen = parse({"item_ids": [["30", "10"], [20, "20"], []]}, {"k": 2})
    assert [r.tolist() for r in rows] == [[0, 2], [1], []] and unknown == [0, 0, 0]
    assert (k, seen) == (2, True)
    with pytest.raises(ValueError, match=r"^row 0: item_ids holds '99', which is not one of the "
                                         r"model's 4 items .* send the param unknown_items=ignore"):
        parse({"item_ids": [["30", "99"]]})
    rows, unknown, _, _ = parse({"item_ids": [["30", "10", "99"], [20, "20"], []]},
                                {"k": 2, "unknown_items": "ignore"})
    assert [r.tolist() for r in rows] == [[0, 2], [1], []] and unknown == [1, 0, 0]


@pytest.mark.parametrize("frame, params, said", [
    ({"item_indices": [[0, -1]]}, None, r"holds -1 \(outside the catalogue\)"),
    ({"item_indices": [[4]]}, None, r"holds 4 \(outside the catalogue\).*0 to 3"),
    ({"item_indices": [[1.0]]}, None, r"holds 1.0 \(not a whole number\)"),
    ({"item_indices": [[True]]}, None, r"holds True \(not a whole number\)"),
    ({"item_ids": [[1.5]]}, None, r"holds 1.5 \(float\); ids are strings"),
    ({"item_ids": ["10"]}, None, r"row 0: item_ids must be a list of items"),
    ({"item_indices": [[0]]}, {"k": 0}, r"param k=0: give a whole number from 1 to the model's 4"),
    ({"item_indices": [[0]]}, {"k": 5}, r"param k=5"),
    ({"item_indices": [[0]]}, {"k": 2.5}, r"param k=2.5"),
    ({"item_indices": [[0]]}, {"top": 2}, r"unknown param\(s\) top: accepted are k, "),
    ({"item_ids": [["10"]]}, {"unknown_items": "skip"}, r"param unknown_items='skip': give refuse"),
    ({"item_indices": [[0]], "item_ids": [["10"]]}, None, r"exactly one of the columns"),
    ({"train_items": [[0]]}, None, r"exactly one of the columns item_ids .* or item_indices"),
])
def test_a_malformed_request_gets_one_clear_error(frame, params, said):
    with pytest.raises(ValueError, match=said):
        parse(frame, params)


# ---- logged to a real tracking server ------------------------------------------------------------

@pytest.fixture(scope="module")
def logged(small_prepared, mlflow_server, tmp_path_factory):
    """A small AutoRec on ml-latest-small logged as training logs it (``log_final``) and registered as
    ``store-good@champion``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mlflow.tracking import MlflowClient

    import mlflow
    from prepared.reader import open_prepared
    from runtime.tracking import log_final

    d = tmp_path_factory.mktemp("logged")
    prep = open_prepared(str(small_prepared))
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": prep.n_items, "width": 8}).eval()
    torch.save(model.state_dict(), d / "weights.pt")
    ids = prep.item_ids()
    pq.write_table(pa.table({"item_id": pa.array(ids, pa.string())}), d / "item_ids.parquet")
    client = MlflowClient(mlflow_server.url)
    exp = client.create_experiment("model-store-test")
    run = client.create_run(exp, run_name="good").info.run_id
    uri = log_final(mlflow_server.url, run, weights=d / "weights.pt", item_ids=d / "item_ids.parquet",
                    model="autorec", model_args=model.model_args(),
                    model_info={"train_splits": "train"}, manifest={}, history=[{"epoch": 1}],
                    summary={}, title="good")
    register(mlflow_server.url, uri, "store-good")
    mlflow.set_tracking_uri(mlflow_server.url)
    return dict(uri=uri, model=model, ids=ids, exp=exp, dir=d)


def register(tracking: str, uri: str, name: str) -> None:
    from mlflow.tracking import MlflowClient

    import mlflow

    mlflow.set_tracking_uri(tracking)
    version = mlflow.register_model(uri, name).version
    MlflowClient(tracking).set_registered_model_alias(name, "champion", version)


def test_a_logged_model_loads_by_alias_from_its_weights(logged, mlflow_server):
    from evaluation.model_source import load_source

    src = load_source("models:/store-good@champion", mlflow_server.url)
    rebuilt = src.build()
    assert src.model == "autorec" and src.train_splits == "train"
    items, offsets = torch.tensor([3, 17, 42]), torch.tensor([0])
    with torch.no_grad():
        assert torch.equal(rebuilt.score(items, offsets), logged["model"].score(items, offsets))


def test_a_logged_model_loads_when_the_project_is_imported_from_sparks_code_zip(logged,
                                                                              mlflow_server):
    """Under Spark the driver may import these modules from the zip ``addPyFile`` ships
    (runtime.spark), where models/pyfunc.py is no file on disk: the code-file check must still
    read it (it once failed there with NotADirectoryError, in the experiment's scoring)."""
    from runtime.spark import _code_zip

    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from evaluation import model_source as m; assert '.zip' in m.__file__, m.__file__; "
            "print(m.load_source('models:/store-good@champion', sys.argv[2]).model)")
    out = subprocess.run([sys.executable, "-c", code, _code_zip(), mlflow_server.url], cwd="/",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-1] == "autorec", out.stderr[-2000:]


def test_the_pyfunc_takes_the_datasets_ids_and_refuses_nonsense(logged):
    import mlflow.pyfunc
    from mlflow.exceptions import MlflowException

    model, ids = logged["model"], logged["ids"]
    pyfunc = mlflow.pyfunc.load_model(logged["uri"])
    history = [[ids[3], ids[17], "no-such-item"], [ids[5]]]
    with pytest.raises(MlflowException, match="row 0: item_ids holds 'no-such-item', which is not"):
        pyfunc.predict(pd.DataFrame({"item_ids": history}), params={"k": 5})
    out = pyfunc.predict(pd.DataFrame({"item_ids": history}),
                         params={"k": 5, "unknown_items": "ignore"})
    for row, (idx, got_ids, unknown) in enumerate(zip(out["item_indices"], out["item_ids"],
                                                      out["unknown_items"])):
        seen = torch.tensor([[3, 17], [5]][row])
        _, top = model.recommend(seen, torch.tensor([0]), 5)
        assert list(idx) == top[0].tolist() and list(got_ids) == [ids[i] for i in idx]
        assert unknown == [1, 0][row]
    by_index = pyfunc.predict(pd.DataFrame({"item_indices": [[3, 17]]}), params={"k": 5})
    assert list(by_index["item_indices"][0]) == list(out["item_indices"][0])
    n = model.n_items
    for frame, params, said in (({"item_indices": [[-1]]}, {"k": 5}, "outside the catalogue"),
                                ({"item_indices": [[2.0]]}, {"k": 5}, "not a whole number"),
                                ({"item_indices": [[1]]}, {"k": 0}, "param k=0"),
                                ({"item_indices": [[1]]}, {"k": n + 1}, f"param k={n + 1}"),
                                # MLflow drops a param its signature lacks: seen and refused
                                ({"item_indices": [[1]]}, {"K": 5}, r"unknown param\(s\) K:")):
        with pytest.raises(MlflowException, match=said):
            pyfunc.predict(pd.DataFrame(frame), params=params)
    assert len(pyfunc.predict(pd.DataFrame({"item_indices": [[1]]}),
                              params={"k": 3})["item_indices"][0]) == 3  # nothing left over


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def one_line_refusal(err: str, uri: str, what: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.startswith("error")]  # (beside MLflow's progress)
    assert len(lines) == 1 and lines[0].startswith(f"error: --model {uri}: refused: "), err
    assert what in lines[0] and "Nothing of it was run" in lines[0], err


def score_main(uri, small_prepared, mlflow_server, tmp_path):
    from evaluation import score

    return score.main(["--model", uri, "--data", str(small_prepared), "--mlflow-uri",
                       mlflow_server.url, "--output", str(tmp_path / "recs"), "-q"])


def test_an_experiment_moving_anothers_champion_says_so(logged, mlflow_server, capsys):
    """experiment/run.py's register: the same run again is no new version; a run of another
    MLflow experiment moves the alias with a NOTE naming the experiment it took it from."""
    from mlflow.tracking import MlflowClient

    from experiment.register import register as register_final
    from experiment.register import registered_name
    from runtime.tracking import log_final

    assert registered_name("", "citeulike-a", "autorec") == "citeulike-a-autorec"
    assert registered_name("citeulike-a-levers", "citeulike-a", "autorec") == \
        "citeulike-a-levers-autorec"
    client = MlflowClient(mlflow_server.url)
    d, model = logged["dir"], logged["model"]
    runs, uris = {}, {}
    for name in ("store-move-first", "store-move-second"):  # a final run in each experiment
        runs[name] = client.create_run(client.create_experiment(name), run_name=name).info.run_id
        uris[name] = log_final(mlflow_server.url, runs[name], weights=d / "weights.pt",
                               item_ids=d / "item_ids.parquet", model="autorec",
                               model_args=model.model_args(), model_info={"train_splits": "train"},
                               manifest={}, history=[{"epoch": 1}], summary={}, title=name)
    source = uris["store-move-first"]
    first = register_final(mlflow_server.url, "store-move", source, runs["store-move-first"])
    assert first == "models:/store-move@champion"
    again = register_final(mlflow_server.url, "store-move", source, runs["store-move-first"])
    assert again == first and len(client.search_model_versions("name='store-move'")) == 1
    assert "NOTE" not in capsys.readouterr().out
    register_final(mlflow_server.url, "store-move", uris["store-move-second"],
                   runs["store-move-second"])
    out = capsys.readouterr().out
    assert "NOTE: store-move@champion moves from version 1" in out
    assert "'store-move-first'" in out and "--register-as" in out
    assert client.get_model_version_by_alias("store-move", "champion").version == "2"


def test_a_cloudpickled_pyfunc_is_refused_and_never_runs(logged, small_prepared, mlflow_server,
                                                         spark, tmp_path, capsys):
    import mlflow.pyfunc

    import mlflow

    marker = tmp_path / "ran"

    class Evil(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input, params=None):
            return model_input

        def __reduce__(self):
            return RunsCode(marker).__reduce__()

    mlflow.set_tracking_uri(mlflow_server.url)
    with mlflow.start_run(experiment_id=logged["exp"], run_name="evil"):
        # requirements given: inferring them would load (and so run) the model at log time
        uri = mlflow.pyfunc.log_model(name="model", python_model=Evil(),
                                      pip_requirements=["mlflow"]).model_uri
    register(mlflow_server.url, uri, "store-evil")
    assert not marker.exists()
    capsys.readouterr()
    alias = "models:/store-evil@champion"
    assert score_main(alias, small_prepared, mlflow_server, tmp_path) == 2
    assert not marker.exists() and not (tmp_path / "recs").exists()
    one_line_refusal(capsys.readouterr().err, alias, "pickled or custom python model")
    with pytest.raises(AttributeError):  # MLflow's own loader runs it (then fails on os.system's 0)
        mlflow.pyfunc.load_model(alias)
    assert marker.exists()  # so the model really is malicious


def test_a_tampered_code_file_is_refused_and_never_runs(logged, small_prepared, mlflow_server,
                                                        spark, tmp_path, capsys):
    import mlflow.pyfunc

    import mlflow
    from runtime.tracking import pyfunc_spec

    marker = tmp_path / "ran"
    code = tmp_path / "pyfunc.py"
    code.write_text((ROOT / "models" / "pyfunc.py").read_text()
                    + f"\nimport os\nos.system('touch {marker}')\n")
    d = logged["dir"]
    spec = pyfunc_spec(weights=d / "weights.pt", item_ids=d / "item_ids.parquet", model="autorec",
                       model_args=logged["model"].model_args(), model_info={})
    mlflow.set_tracking_uri(mlflow_server.url)
    with mlflow.start_run(experiment_id=logged["exp"], run_name="tampered"):
        uri = mlflow.pyfunc.log_model(name="model", **{**spec, "python_model": str(code)}).model_uri
    register(mlflow_server.url, uri, "store-tampered")
    marker.unlink(missing_ok=True)  # whatever MLflow did while logging it
    capsys.readouterr()
    alias = "models:/store-tampered@champion"
    assert score_main(alias, small_prepared, mlflow_server, tmp_path) == 2
    assert not marker.exists() and not (tmp_path / "recs").exists()
    one_line_refusal(capsys.readouterr().err, alias, "differs from this installation's models/pyfunc.py")
    mlflow.pyfunc.load_model(alias)
    assert marker.exists()


def test_mlflow_models_serve_answers_by_ids_and_says_what_is_wrong(logged, mlflow_server):
    """One real REST service of the logged model (``mlflow models serve``, this environment)."""
    from infra.services import free_port

    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    # the server execs uvicorn by name: this environment's bin first, as an activated venv has it
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.url,
           "PATH": f"{mlflow_cli.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([str(mlflow_cli), "models", "serve", "-m", logged["uri"], "--env-manager",
                             "local", "--host", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # generous: a loaded 2-core machine
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(url + "/ping", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "mlflow models serve did not answer /ping"
            time.sleep(1)

        def call(body: dict) -> tuple[int, dict]:
            req = urllib.request.Request(url + "/invocations", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        # the request `make demo` prints (infra.demo.SERVE_REQUEST), verbatim: ml-latest-small's
        # movie ids in, the top k of the user who has them out, theirs excluded
        from infra.demo import SERVE_REQUEST

        status, got = call(SERVE_REQUEST)
        assert status == 200, got
        asked = SERVE_REQUEST["dataframe_records"][0]["item_ids"]
        answer = got["predictions"][0]
        assert len(answer["item_ids"]) == SERVE_REQUEST["params"]["k"] == 10
        assert not set(asked) & set(answer["item_ids"]) and answer["unknown_items"] == 0
        ids = logged["ids"]
        status, got = call({"dataframe_records": [{"item_ids": [ids[3], ids[17]]}],
                            "params": {"k": 4}})
        assert status == 200, got
        _, top = logged["model"].recommend(torch.tensor([3, 17]), torch.tensor([0]), 4)
        answer = got["predictions"][0]
        assert answer["item_ids"] == [ids[i] for i in top[0].tolist()]
        assert np.all(np.diff(answer["scores"]) <= 0)
        status, got = call({"dataframe_records": [{"item_ids": [ids[3]]}], "params": {"k": 0}})
        assert status == 400 and "param k=0" in got["message"], got
        status, got = call({"dataframe_records": [{"item_ids": [ids[3]]}], "params": {"K": 4}})
        assert status == 400 and "unknown param(s) K: accepted are k" in got["message"], got
        status, got = call({"dataframe_records": [{"item_ids": [ids[3], "nope"]}]})
        assert status == 400 and "holds 'nope', which is not one of" in got["message"], got
        status, got = call({"dataframe_records": [{"item_ids": [ids[3], "nope"]}],
                            "params": {"k": 4, "unknown_items": "ignore"}})
        assert status == 200 and got["predictions"][0]["unknown_items"] == 1, got
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_model_file_that_is_not_ours_is_refused_by_layout(tmp_path):
    """The layout check on its own (no server): another flavour, a missing weights artifact."""
    from evaluation.model_source import read_logged

    (tmp_path / "MLmodel").write_text("flavors:\n  sklearn: {pickled_model: model.pkl}\n")
    with pytest.raises(UsageError, match=r"refused: it has the flavour\(s\) sklearn"):
        read_logged("runs:/x/model", tmp_path)
    (tmp_path / "pyfunc.py").write_bytes((ROOT / "models" / "pyfunc.py").read_bytes())
    (tmp_path / "MLmodel").write_text(
        "flavors:\n  python_function:\n    loader_module: mlflow.pyfunc.loaders.code_model\n"
        "    model_code_path: /elsewhere/pyfunc.py\n    config: {model: autorec, model_args: {}}\n"
        "    artifacts: {weights: {path: ../../etc/passwd}}\n")
    with pytest.raises(UsageError, match=r"weights artifact \.\./\.\./etc/passwd is not a file inside"):
        read_logged("runs:/x/model", tmp_path)
