"""A training run as the other stages see it, named once: the files in its directory
OUTPUT/RUN_NAME, the checkpoint's files, and the run summary (recorded in run.json when the run
has finished, and printed as the job's last ``SUMMARY {json}`` line for whoever started it).

What model.pt holds is ``models.registry.payload``'s layout."""

from __future__ import annotations

import json

MODEL_FILE = "model.pt"     # the trained model (models.registry.payload plus config, summary, history)
RUN_RECORD = "run.json"     # configuration, MLflow run, and "summary" once the run has finished
# a Ray Train checkpoint directory: the training state, and the best epoch's weights when validated
CHECKPOINT_STATE, CHECKPOINT_BEST = "state.pt", "best.pt"

SUMMARY_PREFIX = "SUMMARY "


def summary_line(summary: dict) -> str:
    """The job's last line of output: what a script driving it (demo, benchmarks) reads back."""
    return SUMMARY_PREFIX + json.dumps(summary)


def summary_text(line: str) -> str | None:
    """The JSON text of a ``SUMMARY`` line (with its newline, as printed); None for other lines."""
    return line[len(SUMMARY_PREFIX):] if line.startswith(SUMMARY_PREFIX) else None


def summary_in(output: str) -> dict:
    """The summary after the first ``SUMMARY `` in a job's whole output (a log collector may
    prefix the line); ValueError if there is none."""
    if SUMMARY_PREFIX not in output:
        raise ValueError("the job's output has no SUMMARY line")
    return json.loads(output.split(SUMMARY_PREFIX, 1)[1].splitlines()[0])


def finished_record(record: dict, summary: dict) -> dict:
    """run.json's record of a finished run: written last, so a summary means the run is done."""
    return {**record, "summary": summary}


def finished_summary(record: dict | None) -> dict | None:
    """A run's summary from its run.json record: present only once the run has finished."""
    return (record or {}).get("summary")
