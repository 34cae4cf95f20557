"""MLflow's usage telemetry is off in every process the project starts, unless the user turns it
on: its background thread edits os.environ while requests walk it, which killed a trial with
KeyError('_MLFLOW_TELEMETRY_SESSION_ID') (runtime/__init__.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import runtime.tracking, os; "
         "from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY; "
         "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], MLFLOW_DISABLE_TELEMETRY.get())")


def probe(**env) -> str:
    base = {k: v for k, v in os.environ.items()
            if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                         env={**base, "PYTHONPATH": str(ROOT), **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_telemetry_is_off_by_default_and_a_users_choice_is_kept():
    assert probe() == "true True"
    assert probe(MLFLOW_DISABLE_TELEMETRY="false") == "false False"
