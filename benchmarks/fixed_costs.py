"""What each pipeline stage pays on this machine with no data at all: the fixed costs that
``benchmarks/floors.py`` (kernels only) leaves out of yahoo_scale.py's floors.

    .venv/bin/python benchmarks/fixed_costs.py [--repeat 3]

- a Spark stage: ``spark-submit`` (as yahoo_scale.py runs it: local[2]) of a script that starts
  the project's Spark session (``runtime.spark.get_spark``), runs one job through a Python worker
  (a ``mapInArrow`` over one row, as every stage's first pass does) and stops: the JVM, the
  session, the Python worker's start and the imports, and nothing of any stage's own work;
- a training stage: ``training.train.start_ray``'s local Ray (3 logical CPUs for 2 workers x 1
  CPU) and a ``TorchTrainer`` of 2 workers whose loop imports torch, all-reduces one tensor over
  gloo and reports once: Ray's start, the controller, the worker group and DDP's set-up, and no
  data, model or epoch;
- the references measured in the same run: a bare ``python -c pass`` and ``java -version``, the
  process starts no stage can avoid.

Each runs ``--repeat`` times; the median is reported, with the range. Results:
``benchmarks/results/fixed_costs.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402

SPARK = "Spark stage: spark-submit, session, one Python task, stop"
TRAINING = "training stage: local Ray, 2 DDP workers (gloo), one all-reduce and report"


def spark_stage() -> None:
    """The empty Spark stage (run under spark-submit with ``--spark-stage``)."""
    from runtime.spark import get_spark

    spark = get_spark("fixed-costs")
    spark.range(1).mapInArrow(lambda batches: batches, "id long").collect()
    spark.stop()


def training_stage() -> None:
    """The empty training stage (run in a process of its own with ``--training-stage``)."""
    from runtime.raycluster import local_cpus, ray_for

    ray = ray_for(None)  # Ray's settings in place first, as training/train.py starts it
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(num_cpus=local_cpus(2, 1), log_to_driver=False)

    def loop(config):
        import ray.train
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        ray.train.report({"sum": float(t)})

    TorchTrainer(loop, scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                 torch_config=TorchConfig(backend="gloo")).fit()
    ray.shutdown()


def timed(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spark-stage", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--training-stage", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fixed_costs"))
    a = p.parse_args(argv)
    if a.spark_stage:
        spark_stage()
        return 0
    if a.training_stage:
        training_stage()
        return 0

    from infra.submit import spark_submit

    here = Path(__file__).resolve()
    runs = {
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "java -version": (["java", "-version"], None),
        SPARK: spark_submit(str(here.relative_to(ROOT)), "--spark-stage", master="local[2]",
                            driver_memory="6g"),
        TRAINING: ([sys.executable, str(here), "--training-stage"], None),
    }
    times = {name: [timed(cmd, env) for _ in range(a.repeat)] for name, (cmd, env) in runs.items()}
    payload = {**report.stamp("fixed_costs.py", argv), "repeat": a.repeat,
               "seconds": {k: [round(t, 2) for t in v] for k, v in times.items()},
               "median_s": {k: round(statistics.median(v), 2) for k, v in times.items()}}
    med = payload["median_s"]
    spark_s, train_s = med[SPARK], med[TRAINING]
    lines = [
        "# Fixed costs of the pipeline's stages on this machine, with no data", "",
        f"Command: `{payload['command']}`  ",
        f"Machine: {payload['machine']}; {payload['date']}.  ",
        f"Each run {a.repeat} times, median (range).", "",
        "| what | seconds | range |", "|---|---|---|",
        *[f"| {k} | {med[k]:.2f} | {min(v):.2f}–{max(v):.2f} |" for k, v in times.items()], "",
        f"yahoo_scale.py runs three Spark stages (ETL, scoring, evaluation) and one training "
        f"stage: **{3 * spark_s + train_s:.0f} s** of its wall time are these fixed costs "
        f"(3 x {spark_s:.1f} + {train_s:.1f}), which no kernel floor counts. The training stage's "
        "is paid once per run; the Spark stages' once per spark-submit.",
    ]
    report.publish(Path(a.out), payload, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
