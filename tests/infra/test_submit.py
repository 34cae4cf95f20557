"""What the demo shows of a `ray job submit`: the job's own lines, not Ray's banners and records,
which are held back for a failure. The transcript is Ray 2.60's, as its job CLI prints it
(ray/dashboard/modules/job/cli.py) around a training job of this project."""

# ruff: noqa: E501  (the transcript's lines are as long as Ray prints them)
from __future__ import annotations

from infra.submit import RayJobOutput

TRANSCRIPT = """\
2026-12-03 12:07:30,101\tINFO dashboard_sdk.py:338 -- Uploading package gcs://_ray_pkg_4f.zip.
2026-12-03 12:07:30,102\tINFO packaging.py:588 -- Creating a file package for local module '.'.

-------------------------------------------------------
\x1b[32mJob 'raysubmit_Ab12' submitted successfully\x1b[39m
-------------------------------------------------------

Next steps
  Query the logs of the job:
    \x1b[1mray job logs raysubmit_Ab12\x1b[22m
  Query the status of the job:
    ray job status raysubmit_Ab12
  Request the job to be stopped:
    ray job stop raysubmit_Ab12

Tailing logs until the job exits (disable with --no-wait):
2026-12-03 12:07:31,000\tINFO job_manager.py:531 -- Runtime env is setting up.
2026-12-03 12:07:34,704\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.1:41427...
run demo-autorec-seed0: autorec on ml-latest-small (579 training users, 2,245 items), 2 worker(s)
\x1b[36m(TrainController pid=22685)\x1b[0m Requesting resources: {'CPU': 1.0} * 2
\x1b[36m(TrainController pid=22685)\x1b[0m - (ip=127.0.0.1, pid=22798) world_rank=0, local_rank=0, node_rank=0
\x1b[36m(RayTrainWorker pid=22798)\x1b[0m Setting up process group for: env:// [rank=0, world_size=2]
\x1b[36m(DatasetManager pid=22894)\x1b[0m Warning: The Ray cluster currently does not have any available CPUs.
\x1b[36m(RayTrainWorker pid=22798)\x1b[0m Progress bars disabled. To enable, set `enable_progress_bars = True`.
\x1b[36m(RayTrainWorker pid=22798)\x1b[0m epoch   1 | loss 0.48 | valid NDCG 0.1240 (pop 0.1316)
\x1b[36m(TrainController pid=22685)\x1b[0m Worker group failed: a worker died; restarting from the checkpoint
2026-12-03 12:07:40,000\tWARNING worker.py:2100 -- A worker died or was killed.

\x1b[36m(RayTrainWorker pid=22825)\x1b[0m epoch   2 | loss 0.37 | valid NDCG 0.1264 (pop 0.1316) [repeated 2x across cluster]
| model | NDCG |
|---|---|

------------------------------------------
\x1b[32mJob 'raysubmit_Ab12' succeeded\x1b[39m
------------------------------------------

"""

SHOWN = [
    "run demo-autorec-seed0: autorec on ml-latest-small (579 training users, 2,245 items), 2 worker(s)",
    "epoch   1 | loss 0.48 | valid NDCG 0.1240 (pop 0.1316)",
    "(TrainController pid=22685) Worker group failed: a worker died; restarting from the checkpoint",
    "2026-12-03 12:07:40,000\tWARNING worker.py:2100 -- A worker died or was killed.",
    "epoch   2 | loss 0.37 | valid NDCG 0.1264 (pop 0.1316) [repeated 2x across cluster]",
    "| model | NDCG |",
    "|---|---|",
]


def test_the_jobs_own_lines_are_shown_and_rays_are_held_back():
    out = RayJobOutput()
    lines = TRANSCRIPT.splitlines(keepends=True)
    shown = [t for t in map(out.show, lines) if t is not None]
    assert shown == SHOWN
    assert (out.job_id, out.status) == ("raysubmit_Ab12", "succeeded")
    # every line is either shown or held (blank lines aside), none is lost for a failure
    assert len(shown) + len(out.held) == sum(1 for line in lines if line.strip())
    held = "\n".join(out.held)
    for ray_line in ("Next steps", "ray job logs raysubmit_Ab12", "Runtime env is setting up",
                     "Requesting resources", "Setting up process group", "Uploading package",
                     "does not have any available CPUs", "Tailing logs until the job exits",
                     "Job 'raysubmit_Ab12' succeeded"):
        assert ray_line in held
    assert "\x1b[" not in held + "".join(shown)  # colour codes are gone from both


# the same job's banners as Ray's CLI writes them into a pipe (the demo reads one): as log records
PIPE = """\
2026-12-03 13:20:01,100\tINFO dashboard_sdk.py:338 -- Uploading package gcs://_ray_pkg_4f.zip.
2026-12-03 13:20:01,300\tSUCC cli.py:65 -- -------------------------------------------
2026-12-03 13:20:01,300\tSUCC cli.py:66 -- Job 'raysubmit_Cd34' submitted successfully
2026-12-03 13:20:01,300\tSUCC cli.py:67 -- -------------------------------------------
2026-12-03 13:20:01,301\tINFO cli.py:330 -- Next steps
2026-12-03 13:20:01,301\tINFO cli.py:331 -- Query the logs of the job:
2026-12-03 13:20:01,301\tINFO cli.py:333 -- ray job logs raysubmit_Cd34
2026-12-03 13:20:01,400\tINFO cli.py:352 -- Tailing logs until the job exits (disable with --no-wait):
Running entrypoint for job raysubmit_Cd34: python training/train.py --model puresvd
2026-12-03 13:20:03,000\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.1:41427...
run demo-puresvd-seed0: puresvd on ml-latest-small
(RayTrainWorker pid=4242) epoch   1 | valid NDCG 0.2100 (pop 0.1316)
2026-12-03 13:20:09,100\tSUCC cli.py:65 -- ------------------------------
2026-12-03 13:20:09,100\tSUCC cli.py:66 -- Job 'raysubmit_Cd34' succeeded
2026-12-03 13:20:09,100\tSUCC cli.py:67 -- ------------------------------
"""


def test_rays_banners_in_a_pipe_are_log_records_and_held_back_too():
    out = RayJobOutput()
    lines = PIPE.splitlines(keepends=True)
    shown = [t for t in map(out.show, lines) if t is not None]
    assert shown == ["run demo-puresvd-seed0: puresvd on ml-latest-small",
                     "epoch   1 | valid NDCG 0.2100 (pop 0.1316)"]
    assert (out.job_id, out.status) == ("raysubmit_Cd34", "succeeded")
    assert len(out.held) == len(lines) - 2


def test_a_failed_job_is_named_with_its_status_message_held():
    out = RayJobOutput()
    for line in ["Job 'raysubmit_X' submitted successfully\n", "Tailing logs until the job exits\n",
                 "Traceback (most recent call last):\n", "ValueError: bad\n", "---------\n",
                 "Job 'raysubmit_X' failed\n", "---------\n", "Status message: exit code 1\n"]:
        out.show(line)
    assert (out.job_id, out.status) == ("raysubmit_X", "failed")
    assert out.held[-2:] == ["---------", "Status message: exit code 1"]
    assert "ValueError: bad" not in out.held  # the job's traceback was shown as it came


def test_the_readme_serves_as_the_demo_prints_and_the_rest_test_asks():
    """The README's serving commands are the ones `make demo` prints, and its request is the one
    the REST test sends to a real `mlflow models serve` (tests/evaluation/test_model_store.py)."""
    import json
    import re
    from pathlib import Path

    from infra.demo import SERVE_REQUEST, serve_commands

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    serve, curl = serve_commands("http://127.0.0.1:5000", "models:/demo-nce-autorec@champion")
    assert serve in readme
    assert curl.split(" -d ")[0] + " \\" in readme  # the README breaks the line before -d
    assert json.loads(re.search(r"-d '(\{.*?\})'", readme).group(1)) == SERVE_REQUEST
