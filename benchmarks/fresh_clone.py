"""The README's two commands as a newcomer runs them: a fresh clone, an empty home directory, no
RAY_* or MLFLOW_* variables; each command's wall time.

    .venv/bin/python benchmarks/fresh_clone.py [--steps venv,demo,test] [--work DIR] [--alone]
                                               [--load N]

    venv   make venv    the install (uv; torch's CPU or CUDA build as the Makefile picks)
    demo   make demo    the main job on the shipped ml-latest-small (after the install)
    test   make test    the whole suite (after the install)

The clone is of this repository's HEAD (committed work only), into ``--work`` (default a new
folder under /tmp); ``../shared`` beside it is linked when this checkout has one, as CI has it.
``--alone`` clones the repository by itself, as a newcomer does: no ``../shared`` (the tests of
readers for datasets that cannot be shipped are skipped, and ``make test`` says which), no
NCE_DATASETS; its results go to ``fresh_clone_alone.{json,md}``.
``--load N`` runs N CPU-bound processes (busy loops at normal priority) beside every step, as a
shared CI runner or a laptop doing other work would (issue 29: the suite must hold on a loaded
machine); the load average over the steps is recorded, and the results go to
``fresh_clone[_alone]_loaded.{json,md}``.
Each step runs after the previous one in the same clone, so ``demo`` and ``test`` exclude the
install. A demo leaves its stack running for the MLflow UI: it is stopped before the next step.
Results: ``benchmarks/results/fresh_clone.{json,md}`` (merged per step with a previous run's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402

STEPS = {"venv": ["make", "venv"], "demo": ["make", "demo"], "test": ["make", "test"]}


def newcomer_env(home: Path) -> dict[str, str]:
    """This machine's environment less what a newcomer would not have: an empty home and no
    Ray, MLflow or dataset settings (the package index settings stay: they are the machine's,
    not ours)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_", "NCE_"))}
    env["HOME"] = str(home)
    return env


def clone(work: Path, alone: bool = False) -> Path:
    repo = work / "main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    shared = ROOT.parent / "shared"
    if not alone and shared.exists() and not (work / "shared").exists():
        (work / "shared").symlink_to(shared)
    return repo


def run_step(name: str, repo: Path, env: dict[str, str], log: Path) -> dict:
    print(f"\n== {name}: {' '.join(STEPS[name])} (log: {log})", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(STEPS[name], cwd=repo, env=env, stdout=f,
                              stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - t0
    tail = log.read_text().splitlines()[-3:]
    print(f"   exit {code} in {seconds:.0f} s; last lines:\n   " + "\n   ".join(tail), flush=True)
    if name == "demo":  # its stack stays up for the UI; the next step wants the ports
        subprocess.run([str(repo / ".venv" / "bin" / "python"), "-m", "infra.stack", "stop"],
                       cwd=repo, env=env, capture_output=True)
    return {"command": " ".join(STEPS[name]), "exit": code, "seconds": round(seconds, 1),
            "summary": tail[-1] if tail else ""}


@contextmanager
def cpu_load(n: int):
    """``n`` busy-loop processes for the duration; yields a list that fills with the 1-minute
    load average every 30 s (the machine's, so the steps' own work counts too)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    samples: list[float] = []
    done = threading.Event()

    def sample():
        while not done.wait(30):
            samples.append(os.getloadavg()[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        for h in hogs:
            h.kill()
            h.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--steps", default="venv,demo,test",
                   help="which of venv, demo, test, in that order (default all)")
    p.add_argument("--work", default=None, help="where the clone goes (default a new /tmp folder)")
    p.add_argument("--alone", action="store_true",
                   help="clone without ../shared beside it (results: fresh_clone_alone.*)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="N CPU-bound processes beside every step (results: *_loaded.*)")
    args = p.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        p.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="fresh-clone-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.alone and (work / "shared").exists():
        p.error(f"--alone: {work / 'shared'} exists; pick another --work")
    repo = clone(work, args.alone)
    home = work / "home"
    home.mkdir(exist_ok=True)
    env = newcomer_env(home)
    with cpu_load(args.load) as load:
        results = {name: run_step(name, repo, env, work / f"{name}.log")
                   for name in (s for s in STEPS if s in steps)}
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    for r in results.values():
        r["commit"] = commit
        if args.load:
            r["load"] = {"hogs": args.load, "mean_load_average": round(
                sum(load) / len(load), 2) if load else None}
    out = ROOT / "benchmarks" / "results" / ("fresh_clone" + "_alone" * args.alone
                                             + "_loaded" * bool(args.load))
    try:  # merged per step: a run of some steps keeps the others' last results
        previous = json.loads(out.with_suffix(".json").read_text()).get("steps", {})
    except (OSError, ValueError):
        previous = {}
    payload = {**report.stamp("fresh_clone.py", argv), "steps": {**previous, **results}}
    report.publish(out, payload, markdown(payload))
    print(f"\nresults: {out}.md")
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


def markdown(payload: dict) -> list[str]:
    alone = "--alone" in payload["command"]
    loaded = "--load" in payload["command"]
    lines = ["# The README's two commands from a fresh clone"
             + (" of the repository alone (no ../shared)" if alone else "")
             + (", beside CPU-bound processes" if loaded else ""), "",
             f"Command: `{payload['command']}`  ", f"Machine: {payload['machine']}; "
             f"{payload['date']}. A fresh clone of the commit named, an empty home directory, "
             "no RAY_* or MLFLOW_* variables; the machine's package index settings as they are "
             "(here a local wheel cache beside PyPI). Each step after the one before in the same "
             "clone: `demo` and `test` exclude the install."
             + (" Beside every step, busy-loop processes at normal priority (`--load`); the "
                "load average is the machine's 1-minute one, sampled every 30 s over the steps."
                if loaded else ""), "",
             "| step | command | exit | seconds | minutes | commit |"
             + (" busy loops | mean load average |" if loaded else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if loaded else "")]
    for name in STEPS:
        r = payload["steps"].get(name)
        if r:
            load = r.get("load") or {}
            lines.append(f"| {name} | `{r['command']}` | {r['exit']} | {r['seconds']:.0f} | "
                         f"{r['seconds'] / 60:.1f} | {r['commit']} |"
                         + (f" {load.get('hogs', 0)} | {load.get('mean_load_average')} |"
                            if loaded else ""))
    lines += ["", "Last line of each step's output:", ""]
    lines += [f"- {name}: `{r['summary'][:200]}`" for name, r in payload["steps"].items()]
    return lines + [""]

if __name__ == "__main__":
    sys.exit(main())
