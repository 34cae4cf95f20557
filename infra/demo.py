"""The README's main job: the whole pipeline on the shipped ml-latest-small, through the real entry
points, on a local stack.

    1. start the stack (MLflow server + Ray head, loopback; reused if already up)
    2. spark-submit etl/prepare.py           -> var/data/ml-latest-small
    3. ray job submit -- python training/train.py, for NCE-AutoRec, AutoRec and PureSVD
                                                (``--models`` names others, or fewer)
    4. spark-submit evaluation/score.py      -> var/recs/ml-latest-small/RUN   (top 50, test users;
                                                 the models in one application)
    5. spark-submit evaluation/evaluate.py   -> var/eval/ml-latest-small       (table, plots, MLflow)

then prints the results table, the popularity plot's path and the MLflow UI link comparing the two
runs, and writes what it found (test metrics with CIs, popularity, each step's time, the machine,
the code's commit) to ``var/results/demo.{json,md}``: the README quotes a committed copy.
A second run reuses every step whose output is current; ``--redo`` does them all again.
A stack the demo starts is the demo's while it runs: stopped if the demo fails, is interrupted or
killed (a watchdog sees to that even after SIGKILL; SIGTERM stops it at once). After a run that
finishes, the stack is left running (for the MLflow UI); ``make stop`` stops it. A stack that was
already running is reused and left as it was.

The models are selected on the validation split and evaluated on the test split with train+valid
excluded from the candidates (``--exclude train,valid``); the protocol's final retraining on
train+valid (``training/train.py --train-splits train,valid``) is left out to keep the job short.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from infra import stack
from infra.submit import RayJobOutput, ray_job_submit, spark_submit
from prepared.protocol import TOP_K
from runtime import runs
from runtime.atomic import write_text
from runtime.cli import strict_parser
from runtime.runs import RUN_RECORD, summary_line, summary_text

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT / "data" / "ml-latest-small" / "ratings.csv"
# the paper's model, its ablation, and a closed-form baseline to compare both with
MODELS = (("nce-autorec", "NCE-AutoRec"), ("autorec", "AutoRec"), ("puresvd", "PureSVD"))
LABELS = dict(MODELS)  # a model of --models not among them is labelled by its registry name


def chosen_models(text: str) -> tuple[tuple[str, str], ...]:
    """``--models``' comma list as (model, label) pairs, each a registered model, none twice."""
    from models.registry import MODELS as REGISTERED

    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in REGISTERED]
    if not names or unknown or len(set(names)) < len(names):
        what = (f"unknown model(s) {', '.join(unknown)}" if unknown else
                "a model named twice" if names else "no model named")
        raise argparse.ArgumentTypeError(
            f"{what}: give a comma list of {', '.join(REGISTERED)} "
            f"(default {','.join(m for m, _ in MODELS)})")
    return tuple((n, LABELS.get(n, n)) for n in names)


def step(n: int, text: str) -> None:
    print(f"\n== {n}/5 {text}", flush=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepared_is_current(out: Path, dataset: Path, seed: int) -> bool:
    manifest = out / "manifest.json"
    if not manifest.exists():
        return False
    m = json.loads(manifest.read_text())
    return (m.get("inputs", [{}])[0].get("sha256") == sha256(dataset)
            and m["parameters"]["seed"] == seed)


def run_streaming(cmd: list[str], env: dict, what: str, ray_job: RayJobOutput | None = None
                  ) -> str | None:
    """Run ``cmd``, passing its output through indented; returns its SUMMARY line's JSON text.
    With ``ray_job``, Ray's own lines are held back, printed only if the job fails."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    summary = None
    for line in proc.stdout:
        if summary_text(line) is not None:
            summary = summary_text(line)
            continue
        text = ray_job.show(line) if ray_job else line.rstrip("\n")
        if text is not None:
            print(("   " + text) if text.strip() else "", flush=True)
    if proc.wait() != 0:
        if ray_job and ray_job.held:
            print("   Ray's own lines of this job, held back while it ran:")
            print("\n".join("     " + h for h in ray_job.held), flush=True)
        raise SystemExit(f"{what} failed (exit {proc.returncode}); see the lines above")
    if ray_job:
        print(f"   Ray job {ray_job.job_id} {ray_job.status or 'ended'}", flush=True)
    return summary


def run_spark(script: str, *args: str) -> None:
    cmd, env = spark_submit(script, *args)
    print("$ spark-submit " + " ".join([script, *args]), flush=True)
    run_streaming(cmd, env, script)


def finished_summary(run_dir: Path) -> dict | None:
    try:
        return runs.finished_summary(json.loads((run_dir / RUN_RECORD).read_text()))
    except (OSError, json.JSONDecodeError):
        return None


def train(model: str, prepared: Path, var: Path, seed: int, redo: bool, ray: stack.Running,
          mlflow_url: str, epochs: int | None) -> dict:
    """``ray job submit ... -- python training/train.py`` unless the run finished already."""
    name = f"demo-{model}-seed{seed}"
    run_dir = var / "runs" / name
    if redo and run_dir.exists():
        shutil.rmtree(run_dir)
    done = finished_summary(run_dir)
    if done and done.get("mlflow_uri") != mlflow_url:
        print(f"   {name} was trained against another tracking store ({done.get('mlflow_uri')}); "
              f"training it again under the stack's MLflow ({mlflow_url})")
        shutil.rmtree(run_dir)
        done = None
    if done:
        print(f"   {name} finished already (best epoch {done['best_epoch']}); --redo to retrain")
        return done
    args = ["python", "training/train.py", "--data", str(prepared), "--model", model,
            "--seed", str(seed), "--run-name", name, "--runs-dir", str(var / "runs"),
            "--mlflow-uri", mlflow_url] + (["--epochs", str(epochs)] if epochs else [])
    cmd, env = ray_job_submit(ray.url, args, stack.client_env({"ray": ray}))
    print("$ ray job submit --address " + ray.url + " --working-dir . -- " + " ".join(args),
          flush=True)
    try:
        summary = run_streaming(cmd, env, f"training {model}", RayJobOutput())
    except SystemExit:
        if not stack.healthy(ray):
            raise SystemExit(
                f"training {model} stopped because the Ray head at {ray.url} is gone (its job "
                f"server does not answer). Rerun this command: it restarts the stack and training "
                f"resumes from the last checkpoint in {run_dir}") from None
        raise
    if summary is None:
        raise SystemExit(f"training {model}: the job ended without its SUMMARY line")
    return json.loads(summary)


# the port `mlflow models serve` gets in the printed commands: not 5000, the stack's MLflow
SERVE_PORT = 5001
# a request a user can copy: the history of a user who liked Toy Story, Star Wars and Fargo
# (ml-latest-small's movie ids), their top 10 back
SERVE_REQUEST = {"dataframe_records": [{"item_ids": ["1", "260", "608"]}], "params": {"k": 10}}


def register_models(models, summaries: dict, mlflow_url: str) -> dict[str, str]:
    """Each model of the demo in MLflow's registry as ``demo-MODEL``, alias ``@champion`` (a
    rerun registers nothing new), so that it can be served by name; returns their URIs."""
    import contextlib
    import io

    from experiment.register import register

    uris = {}
    for model, label in models:
        s = summaries[label]
        chatter = io.StringIO()  # MLflow's "Successfully registered ..." lines
        try:
            with contextlib.redirect_stderr(chatter), contextlib.redirect_stdout(chatter):
                uris[label] = register(mlflow_url, f"demo-{model}", s["model_uri"],
                                       s["mlflow_run_id"])
        except Exception:
            print(chatter.getvalue(), file=sys.stderr)
            raise
    print("   registered: " + ", ".join(uris.values()), flush=True)
    return uris


def serve_commands(mlflow_url: str, model_uri: str) -> list[str]:
    """The two commands that serve ``model_uri`` and ask it for one user's recommendations."""
    return [f"MLFLOW_TRACKING_URI={mlflow_url} mlflow models serve -m {model_uri} "
            f"--env-manager local -p {SERVE_PORT}",
            f"curl -s http://127.0.0.1:{SERVE_PORT}/invocations -H 'Content-Type: application/json' "
            f"-d '{json.dumps(SERVE_REQUEST)}'"]


def recs_are_current(out: Path, model_uri: str) -> bool:
    try:
        return json.loads((out / "_manifest.json").read_text())["model"] == model_uri
    except (OSError, json.JSONDecodeError, KeyError):
        return False


def evaluation_is_current(out: Path, recs: dict[str, Path]) -> bool:
    """Whether ``out`` evaluated exactly these lists (``recs``: label -> folder; a run with other
    --models evaluates again) after they were last written."""
    marker = out / "manifest.json"
    try:
        labels = {r["label"] for r in json.loads(marker.read_text())["rows"]}
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        return False
    return labels == set(recs) and all(
        marker.stat().st_mtime > (r / "_manifest.json").stat().st_mtime for r in recs.values())


def runs_url(mlflow_url: str, run_id: str, chart: bool = False) -> str:
    """The experiment of ``run_id`` in the UI: its runs, best test NDCG first; ``chart``: as
    bar charts, one per metric (the UI's search box narrows them, e.g. to ``test_``)."""
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(mlflow_url).get_run(run_id).info.experiment_id
    return (f"{mlflow_url}/#/experiments/{exp}/runs?orderByKey=metrics.%60test_ndcg%60"
            f"&orderByAsc=false" + ("&compareRunsMode=CHART" if chart else ""))


def compare_url(mlflow_url: str, run_ids: list[str]) -> str:
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(mlflow_url).get_run(run_ids[0]).info.experiment_id
    q = urllib.parse.quote
    compact = lambda x: json.dumps(x, separators=(",", ":"))  # as the UI's own links
    return (f"{mlflow_url}/#/compare-runs?runs={q(compact(run_ids))}"
            f"&experiments={q(compact([exp]))}")


def machine() -> dict:
    import platform

    from runtime.machine import cpu

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    info = cpu()
    return {"cores": os.cpu_count(), "memory_gib": round(mem, 1), "arch": platform.machine(),
            "cpu": info["model"], "cpu_flags": info["flags"], "os": platform.system(),
            "python": platform.python_version()}


def commit(exclude: tuple[str, ...] = ()) -> str:
    """The code's commit, ``+dirty`` when the work tree differs from it (paths matching
    ``exclude``, git pathspecs, left out of that comparison)."""
    spec = ["--", ".", *(f":(exclude){p}" for p in exclude)] if exclude else []
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", *spec],
                               cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if dirty else "")


def options_text(args) -> str:
    """The demo's non-default options as the results file names them: `` (--epochs 2)``."""
    chosen = [f"--epochs {args.epochs}"] if args.epochs else []
    if args.models != MODELS:
        chosen.append("--models " + ",".join(m for m, _ in args.models))
    return f" ({' '.join(chosen)})" if chosen else ""


def write_results(folder: Path, evaluation: Path, summaries: dict, counts: dict,
                  timings: dict, var: Path, args) -> Path:
    """``demo.json`` and ``demo.md``: what this run found and what it took, with paths relative to
    the project (no machine's directories in a file meant to be committed)."""
    from evaluation.evaluate import report

    m = json.loads((evaluation / "manifest.json").read_text())
    local = lambda text: text.replace(str(var), "var").replace(str(ROOT), ".")
    summary = {
        "command": "make demo" + options_text(args),
        "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(), "machine": machine(),
        "dataset": {"name": "ml-latest-small", "seed": args.seed, **counts},
        "training": {label: {k: s.get(k) for k in ("best_epoch", "epochs_run", "best_valid_ndcg",
                                                    "best_valid_recall_at_50")}
                     for label, s in summaries.items()},
        "test": [r for r in m["rows"] if r["group"] in ("warm", "cold")],
        "popularity": m["popularity"], "seconds": timings,
    }
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "demo.json", json.dumps(summary, indent=2) + "\n")  # each whole, or as it was
    md = [f"# The main job (`{summary['command']}`)", "",
          f"Date: {summary['date']}; commit {summary['commit']}; machine: "
          + ", ".join(f"{k} {v}" for k, v in summary["machine"].items()) + ".", "",
          f"Data: ml-latest-small, {counts['users']:,} users ({counts['cold_users']:,} cold-start), "
          f"{counts['items']:,} items; models selected on validation (early stopping), evaluated "
          "on test with train and valid items excluded.", "",
          "| model | best epoch | epochs run | validation NDCG |", "|---|---|---|---|"]
    md += [f"| {label} | {t['best_epoch']} | {t['epochs_run']} | {t['best_valid_ndcg']:.4f} |"
           for label, t in summary["training"].items()]
    md += ["", "```", local(report(m, str(evaluation))), "```", "",
           "Seconds per step (a reused step takes about none):", "",
           "| " + " | ".join(timings) + " |", "|" + "---|" * len(timings),
           "| " + " | ".join(f"{v:.0f}" for v in timings.values()) + " |", ""]
    write_text(folder / "demo.md", "\n".join(md))
    return folder / "demo.md"


def main(argv: list[str] | None = None) -> int:
    p = strict_parser(prog="python -m infra.demo", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--var", default=str(ROOT / "var"), help="where outputs go (default ./var)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--redo", action="store_true", help="redo every step even if its output exists")
    p.add_argument("--input", default=str(DATASET),
                   help="ratings.csv in ml-latest-small's format (default: the shipped one)")
    p.add_argument("--models", type=chosen_models, default=MODELS, metavar="M1,M2,...",
                   help="the models to train and compare, by name (default "
                        + ",".join(m for m, _ in MODELS) + "; any of training/train.py's)")
    p.add_argument("--epochs", type=int, default=None,
                   help="most training epochs per model (default: training's, with early stopping)")
    p.add_argument("--stack-state", default=str(stack.STATE),
                   help="where the stack's record lives (default var/stack)")
    p.add_argument("--mlflow-config", default=str(stack.MLFLOW_CONFIG),
                   help="the MLflow server's settings (default mlflow/server.json)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    clock = [time.perf_counter()]

    def lap(name: str) -> None:  # seconds since the last lap, under ``name``
        now = time.perf_counter()
        timings[name] = round(now - clock[0], 1)
        clock[0] = now

    state = Path(args.stack_state)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ends through the except below
    try:
        code = run_steps(args, state, lap, timings, t0)
    except BaseException:
        # what this run started stops with it (the user's stack it reused is left alone)
        stack.stop(state, log=lambda s: print("   " + s, flush=True), owner=os.getpid(), grace=3)
        raise
    # finished: the stack is the user's now, up for the MLflow UI until `make stop`
    stack.release(state, owner=os.getpid())
    return code


def run_steps(args, state: Path, lap, timings: dict, t0: float) -> int:
    """The five steps and the report (``main`` owns the stack's lifetime)."""
    dataset = Path(args.input).resolve()
    var = Path(args.var).resolve()
    prepared = var / "data" / "ml-latest-small"
    step(1, "local stack: MLflow tracking server and Ray head (loopback)")
    running = stack.start(state=state, mlflow_config=Path(args.mlflow_config),
                          log=lambda s: print("   " + s, flush=True), owner=os.getpid())
    mlflow_url = running["mlflow"].url
    os.environ.update(stack.client_env(running))  # this process and what it starts talk to the head
    lap("stack")

    step(2, f"ETL on Spark: ml-latest-small -> {prepared}")
    if not args.redo and prepared_is_current(prepared, dataset, args.seed):
        print("   already prepared (same input and seed); --redo to prepare again")
    else:
        run_spark("etl/prepare.py", "--dataset", "ml-latest-small", "--input", str(dataset),
                  "--output", str(prepared), "--seed", str(args.seed), "--overwrite")
    c = json.loads((prepared / "manifest.json").read_text())["counts"]
    print(f"   {c['users']:,} users ({c['cold_users']:,} cold-start), {c['items']:,} items, "
          "positives " + ", ".join(f"{k} {v:,}" for k, v in c["positives"].items()))
    lap("etl")

    step(3, "training on Ray Train (2 workers, ray job submit), tracked in MLflow")
    summaries = {}
    for model, label in args.models:
        s = train(model, prepared, var, args.seed, args.redo, running["ray"], mlflow_url,
                  args.epochs)
        summaries[label] = s
        print(f"   {label}: best epoch {s['best_epoch']} of {s['epochs_run']}, validation NDCG "
              f"{s['best_valid_ndcg']:.4f}, model {s['model_uri']}", flush=True)
        lap(f"train {label}")

    step(4, "batch scoring on Spark: top 50 for every user, train+valid excluded")
    recs, todo = {}, {}
    for label, s in summaries.items():
        out = var / "recs" / "ml-latest-small" / s["run_name"]
        recs[label] = out
        if not args.redo and recs_are_current(out, s["model_uri"]):
            print(f"   {label}: already scored ({out})")
        else:
            todo[s["model_uri"]] = str(out)
    if todo:  # one Spark application for every model: one start-up, not three
        run_spark("evaluation/score.py", "--model", *todo, "--mlflow-uri", mlflow_url,
                  "--data", str(prepared), "--output", *todo.values(), "--k", str(TOP_K),
                  "--exclude", "train,valid", "--overwrite", "-q")
    lap("score")

    step(5, "evaluation on Spark: metrics with 95% CIs, popularity, cold start -> MLflow")
    evaluation = var / "eval" / "ml-latest-small"
    from evaluation.evaluate import report
    if not args.redo and evaluation_is_current(evaluation, recs):
        print(f"   already evaluated ({evaluation})\n")
        print(report(json.loads((evaluation / "manifest.json").read_text()), str(evaluation)))
    else:
        run_spark("evaluation/evaluate.py", "--recs", *map(str, recs.values()),
                  "--labels", *recs.keys(), "--data", str(prepared), "--output", str(evaluation),
                  "--mlflow-uri", mlflow_url, "--overwrite", "-q")
    lap("evaluate")
    timings["total"] = round(time.perf_counter() - t0, 1)

    served = register_models(args.models, summaries, mlflow_url)
    run_ids = [s["mlflow_run_id"] for s in summaries.values()]
    results = write_results(var / "results", evaluation, summaries, c, timings, var, args)
    print(f"\npopularity plot: {evaluation / 'popularity.png'}")
    print(f"cold-start plot: {evaluation / 'cold_start.png'}")
    print(f"MLflow UI, the runs by test NDCG: {runs_url(mlflow_url, run_ids[0])}")
    print(f"  as charts (type test_ in its search box): {runs_url(mlflow_url, run_ids[0], True)}")
    print(f"  side by side: {compare_url(mlflow_url, run_ids)}")
    print(f"results (metrics, popularity, timings, machine, commit): {results}")
    print("serve a model over REST (another shell, the venv active; a user's item ids in, their "
          "top k out):\n" + "\n".join("  " + line for line in serve_commands(
              mlflow_url, next(iter(served.values())))))
    print(f"done in {timings['total']:.0f}s; the stack keeps running for the UI "
          "(stop it with: make stop)")
    print(summary_line({"runs": dict(zip(summaries, run_ids)), "evaluation": str(evaluation),
                        "mlflow": mlflow_url, "results": str(results)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
