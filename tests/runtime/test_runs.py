"""runtime.runs: the run summary line read back as printed; model.pt's layout in one place."""

from __future__ import annotations

import io

import pytest
import torch

from models.registry import build, payload, read, save
from runtime.runs import finished_record, finished_summary, summary_in, summary_line, summary_text


def test_the_summary_line_reads_back_as_printed():
    summary = {"best_epoch": 3, "model_path": "/r/model.pt", "best_valid_ndcg": None}
    line = summary_line(summary) + "\n"  # as a driver reads it from the job's output
    assert line.startswith("SUMMARY {")
    assert summary_in("epoch 1\n(worker) " + line + "bye\n") == summary
    assert summary_text("epoch 3 SUMMARY {}") is None  # only a line that starts with it
    with pytest.raises(ValueError, match="no SUMMARY line"):
        summary_in("epoch 1\n")


def test_a_run_record_has_a_summary_only_once_finished():
    record = {"config": {"model": "ease"}, "mlflow_run_id": "r1"}
    assert finished_summary(record) is None and finished_summary(None) is None
    done = finished_record(record, {"best_epoch": 1})
    assert finished_summary(done) == {"best_epoch": 1} and "summary" not in record


def test_a_runs_payload_and_a_saved_model_share_one_layout():
    model = build("puresvd", {"n_items": 7, "rank": 2})
    saved = save(model, summary={"best_epoch": 0})
    run = payload(model.name, model.model_args(), saved["state_dict"], summary={"best_epoch": 0})
    assert list(run) == list(saved) == ["model", "model_args", "state_dict", "summary"]
    buf = io.BytesIO()
    torch.save(run, buf)
    buf.seek(0)
    back = read(torch.load(buf, weights_only=True), "model.pt")
    assert back.model_args() == model.model_args()
