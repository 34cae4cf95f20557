"""Model files and checkpoints load weights-only: a file whose pickle would run code is refused
with one line by scoring and by a resume, and the code never runs."""

from __future__ import annotations

import json
import os

import pytest
import torch

from training import train

pytestmark = pytest.mark.spark  # the prepared ml-latest-small comes from the session's Spark


class RunsCode:
    """What a tampered file could hold: unpickling it calls os.system."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def tampered(path, marker) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": "autorec", "state_dict": {}, "model_args": {"n_items": 3},
                "config": RunsCode(marker)}, path)


def one_line_refusal(err: str, what: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and what in lines[0], err
    assert "refused" in lines[0] and "could run code" in lines[0], err


def test_score_refuses_a_model_file_that_would_run_code(spark, small_prepared, tmp_path, capsys):
    from evaluation import score

    model, marker = tmp_path / "run" / "model.pt", tmp_path / "ran"
    tampered(model, marker)
    rc = score.main(["--model", str(model), "--data", str(small_prepared),
                     "--output", str(tmp_path / "recs"), "-q"])
    assert rc == 2 and not marker.exists() and not (tmp_path / "recs").exists()
    one_line_refusal(capsys.readouterr().err, str(model))


@pytest.mark.parametrize("trained", [False, True], ids=["checkpoint", "model"])
def test_a_resume_refuses_a_tampered_file(small_prepared, tmp_path, capsys, trained):
    """An interrupted run (a checkpoint) and a trained one whose logging is pending (model.pt):
    both are refused before Ray or MLflow start."""
    argv = ["--data", str(small_prepared), "--model", "autorec", "--runs-dir", str(tmp_path / "runs"),
            "--run-name", "r", "--mlflow-uri", "http://127.0.0.1:9"]
    cfg = train.config_from_args(train.build_parser().parse_args(argv),
                                 train.open_prepared(str(small_prepared)))
    run_dir, marker = tmp_path / "runs" / "r", tmp_path / "ran"
    bad = run_dir / ("model.pt" if trained else "checkpoint_2026-01-01_00-00-00.000000/state.pt")
    tampered(bad, marker)
    record = {"config": cfg.to_dict(), "mlflow_uri": "x", "mlflow_run_id": "x"}
    if trained:
        record["trained"] = {"best_epoch": 1}
    (run_dir / "run.json").write_text(json.dumps(record))
    assert train.main(argv) == 2 and not marker.exists()
    one_line_refusal(capsys.readouterr().err, str(bad))
