"""spark-submit runs evaluation/score.py as ``__main__``: the functions the scoring job ships to the
executors must still come from the importable module, or every task rebuilds the model (a fresh
``_CACHE`` travels with functions pickled by value)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_runs_the_importable_modules_main():
    code = ("import runpy, sys; import evaluation.score as m; "
            "m.main = lambda: print('module main', flush=True) or 0; "
            "sys.argv = ['evaluation/score.py']; "
            "runpy.run_path('evaluation/score.py', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["module main"]


def test_a_shipped_task_shares_its_workers_model_cache():
    from pyspark import cloudpickle

    import evaluation.score as m

    fn = m.score_shards_fn("rows", "out", [], "all", None, 16, {})
    shipped = pickle.loads(cloudpickle.dumps(fn))
    # by reference: the worker's own module, so its _CACHE outlives the task
    assert shipped.__globals__["score_batches"] is m.score_batches
    assert m._model.__globals__["_CACHE"] is m._CACHE
