"""training.hooks: what a test injects into a run's workers, named from outside the loop."""

from __future__ import annotations

import inspect
import re
import signal
import subprocess
import sys

import pytest

from prepared.errors import UsageError
from training import faults, hooks, loop


def test_the_training_loop_knows_no_fault_by_name():
    source = inspect.getsource(loop)
    # as a word: "setdefault" is not a fault
    assert not re.search(r"\bfaults?\b", source) and "SIGKILL" not in source


def test_hooks_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(hooks.ENV, raising=False)
    assert hooks.hook_specs() == []
    monkeypatch.setenv(hooks.ENV, "training.faults:kill_a_rank:1, os:getpid")
    assert hooks.hook_specs() == ["training.faults:kill_a_rank:1", "os:getpid"]
    assert hooks.resolve(hooks.hook_specs()) == [(faults.kill_a_rank, "1"), (__import__("os").getpid, None)]
    with pytest.raises(UsageError, match=r"NCE_TEST_HOOK: 'training.faults:nope' is not an "
                                         r"importable module:function.*fix or unset it"):
        hooks.resolve(["training.faults:nope"])


def test_kill_a_rank_kills_rank_one_once_at_its_epoch(tmp_path):
    context = {"epoch": 2, "rank": 1, "world": 2, "run_dir": str(tmp_path)}
    hooks.call_all(hooks.resolve(["training.faults:kill_a_rank:1"]), context)  # another epoch
    hooks.call_all(hooks.resolve(["training.faults:kill_a_rank:2"]), {**context, "rank": 0})
    assert not (tmp_path / faults.MARKER).exists()
    code = ("import time; time.sleep = lambda s: None\n"
            "from training import hooks\n"
            f"hooks.call_all(hooks.resolve(['training.faults:kill_a_rank:2']), {context!r})\n")
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (tmp_path / faults.MARKER).read_text() == "killed rank 1 at the start of epoch 3\n"
    # the marker stays: the restarted worker runs on
    lives = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert lives.returncode == 0, lives.stderr
