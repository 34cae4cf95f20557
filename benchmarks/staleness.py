"""Which committed results are older than the code they measure, from git alone.

Every result under ``benchmarks/results`` (and the cluster run's under ``infra/cluster/results``)
is listed in ``MEASURES`` with the paths whose behaviour sets its numbers: the script that wrote it
and the modules it times or whose quality it reports. A result is *stale* when a commit after the
one that produced it touched any of those paths. The producing commit is the one the result
records (``"commit"`` in its JSON, or a ``Commit:`` line in its Markdown); a result that records
none is dated by the last commit that changed its file, which is later than (or equal to) the code
it ran on, so such a result can only look fresher than it is, never staler.

A commit that only edits comments, docstrings or layout of a Python file, or the comments of a
YAML grid, does not count (the syntax tree, or the parsed values, are compared); every other
change to a measured path does. Nothing else is consulted: no list of commits read and judged
harmless, so a refactor that kept every number still shows, and a stale result is a reason to read
those commits (``--result NAME``) or rerun the benchmark, not proof that a number moved.

    python benchmarks/staleness.py            # the table, all results
    python benchmarks/staleness.py --check    # exit 1 when any result is stale
    python benchmarks/staleness.py --result loss_speed   # every commit since, for one result

Not part of ``make test`` (a code change would fail the suite until every benchmark reran); the
suite checks that every result is listed here and that the verdicts follow the history
(``tests/benchmarks/test_staleness.py``, on scratch git repositories)."""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLUSTER_RESULTS = ROOT / "infra" / "cluster" / "results"

AUTOREC = ("models/autorec", "models/losses.py", "models/base.py")
TRAINING = ("training/loop.py", "training/step.py", "training/validate.py", "training/feed.py")
EVALUATION = ("evaluation/evaluate.py", "evaluation/spark_metrics.py",
              "evaluation/significance.py", "evaluation/seeds.py", "evaluation/popularity.py",
              "prepared/metrics.py")
EXPERIMENT = ("experiment", "models", "training", "evaluation")
GRIDS = "benchmarks/grids/"

# scoring's product and its fused top-k (models.stream_topk, built by models.native)
SCORING_KERNEL = ("models/product.py", "models/stream_topk.py", "models/native.py")
# two results each (as run, and with the host's OPENBLAS_CORETYPE pin removed): the same paths
TRAIN_STEP = ("benchmarks/train_step.py", "benchmarks/loss_speed.py", *AUTOREC,
              "training/step.py", "models/product.py")
SCORE_THROUGHPUT = ("benchmarks/score_throughput.py", "evaluation/score.py", "models/serving.py",
                    "models/topk.py", "models/base.py", "models/autorec/model.py", *SCORING_KERNEL)

# result name (a file stem in benchmarks/results, a folder there, or "local_cluster") -> the
# paths (files or folders, from the repository root) whose behaviour sets its numbers
MEASURES: dict[str, tuple[str, ...]] = {
    "batch_defaults": ("benchmarks/batch_defaults.py", *AUTOREC, *TRAINING, "training/config.py"),
    "collapse": ("benchmarks/collapse.py", *AUTOREC, *TRAINING, "training/config.py"),
    "demo": ("infra/demo.py", "infra/stack.py", *AUTOREC, "models/puresvd.py", "training",
             "evaluation", "etl"),
    "etl_scale": ("benchmarks/etl_scale.py", "benchmarks/etl_floor.py", "etl",
                  "prepared/protocol.py"),
    "evaluate_speed": ("benchmarks/evaluate_speed.py", *EVALUATION),
    "finetune_convergence": ("benchmarks/finetune_convergence.py", *AUTOREC, *TRAINING),
    "floors": ("benchmarks/floors.py", "benchmarks/peak.py"),
    "fixed_costs": ("benchmarks/fixed_costs.py", "runtime/spark.py", "runtime/raycluster.py"),
    "fold_in": ("benchmarks/fold_in.py", "benchmarks/tune_defaults.py", "models/peruser.py",
                "models/bpr.py", "models/cml.py", "models/cdae.py", "models/topk.py", *TRAINING),
    "fold_in_speed": ("benchmarks/fold_in_speed.py", "models/peruser.py"),
    "verify_cost": ("benchmarks/verify_cost.py", "prepared/reader.py", "prepared/files.py"),
    # the install, the demo and the whole suite: the tests' own changes move the suite's time
    "fresh_clone": ("benchmarks/fresh_clone.py", "Makefile", "pyproject.toml", "infra/demo.py",
                    "tests", ".ci"),
    "fresh_clone_alone": ("benchmarks/fresh_clone.py", "Makefile", "pyproject.toml",
                          "infra/demo.py", "tests", ".ci"),
    "fresh_clone_loaded": ("benchmarks/fresh_clone.py", "Makefile", "pyproject.toml",
                           "infra/demo.py", "tests", ".ci"),
    "fresh_clone_alone_loaded": ("benchmarks/fresh_clone.py", "Makefile", "pyproject.toml",
                                 "infra/demo.py", "tests", ".ci"),
    "loss_speed": ("benchmarks/loss_speed.py", *AUTOREC, "training/step.py"),
    "train_step": TRAIN_STEP,
    "train_step_unpinned": TRAIN_STEP,
    "loss_speed_width": ("benchmarks/loss_speed.py", *AUTOREC, "training/step.py"),
    "nce_report": ("benchmarks/nce_report.py",),
    "negative_draws": ("benchmarks/negative_draws.py", "prepared/protocol.py"),
    "peruser_step_speed": ("benchmarks/peruser_step_speed.py", "models/peruser.py"),
    "quality_ml100k": ("benchmarks/quality_ml100k.py", *AUTOREC, *TRAINING),
    "score_throughput": SCORE_THROUGHPUT,
    "score_throughput_unpinned": SCORE_THROUGHPUT,
    "scoring_exact": ("benchmarks/scoring_exact.py", "models/base.py", "models/topk.py",
                      *SCORING_KERNEL),
    "scoring_exact_openblas": ("benchmarks/scoring_exact.py", "models/base.py", "models/topk.py",
                               *SCORING_KERNEL),
    "alternatives": ("benchmarks/alternatives.py", "evaluation/score.py", "models/base.py",
                     *SCORING_KERNEL, *AUTOREC, *TRAINING),
    # scoring only: the models are the Gowalla experiments' (DERIVED_FROM below)
    "ensemble_check": ("benchmarks/ensemble_check.py", "benchmarks/probe.py", "models"),
    "preset_check": ("benchmarks/preset_check.py", "benchmarks/final_in_process.py",
                     "benchmarks/tune_defaults.py", "models", "training", "etl/synthetic.py"),
    "train_throughput": ("benchmarks/train_throughput.py", *AUTOREC, "training"),
    "scale_out": ("benchmarks/scale_out.py", "benchmarks/train_throughput.py", *AUTOREC,
                  "training"),
    "tune_defaults": ("benchmarks/tune_defaults.py", *AUTOREC, *TRAINING, "training/config.py"),
    "validation_speed": ("benchmarks/validation_speed.py", "training/validate.py",
                         "models/base.py", "models/topk.py"),
    "yahoo_scale": ("benchmarks/yahoo_scale.py", "etl", "training", "evaluation", *AUTOREC),
    "projection": ("benchmarks/projection.py", "benchmarks/yahoo_scale.py", "etl", "training",
                   "evaluation", *AUTOREC),
    # an experiment, by the grid files it searched (another experiment's grid is not its code)
    "experiment-ml-100k": (*EXPERIMENT, GRIDS + "protocol.yaml"),
    "experiment-ml-latest-small": (*EXPERIMENT, GRIDS + "protocol.yaml"),
    "experiment-citeulike-a": (*EXPERIMENT, GRIDS + "citeulike-protocol.yaml"),
    "experiment-ml-100k-levers": (*EXPERIMENT, GRIDS + "levers.yaml"),
    "experiment-citeulike-a-levers": (*EXPERIMENT, GRIDS + "levers-citeulike-a.yaml",
                                      GRIDS + "levers-citeulike-a-finals.yaml"),
    "experiment-ml-latest-small-levers": (*EXPERIMENT, GRIDS + "levers-ml-latest-small.yaml"),
    "experiment-ml-100k-start": (*EXPERIMENT, GRIDS + "start.yaml"),
    "experiment-ml-latest-small-start": (*EXPERIMENT, GRIDS + "start.yaml"),
    "experiment-gowalla-probe": (*EXPERIMENT, GRIDS + "gowalla-probe.yaml"),
    "experiment-gowalla-width": (*EXPERIMENT, GRIDS + "gowalla-width.yaml"),
    "experiment-gowalla-wide": (*EXPERIMENT, GRIDS + "gowalla-wide.yaml", "benchmarks/probe.py",
                                "benchmarks/final_in_process.py"),
    "experiment-gowalla-ensemble": (*EXPERIMENT, GRIDS + "gowalla-wide.yaml", "models/ensemble.py",
                                    "experiment/ensemble.py", "benchmarks/final_in_process.py"),
    "experiment-gowalla-top": (*EXPERIMENT, GRIDS + "gowalla-wide.yaml", "models/ensemble.py",
                               "experiment/ensemble.py", "benchmarks/final_in_process.py"),
    "experiment-citeulike-a-ensemble": (*EXPERIMENT, GRIDS + "levers-citeulike-a-finals.yaml",
                                        "models/ensemble.py", "experiment/ensemble.py"),
    "experiment-ml-latest-small-ensemble": (*EXPERIMENT, GRIDS + "ensemble-ml-latest-small.yaml",
                                            "models/ensemble.py", "experiment/ensemble.py"),
    "probes-levers": ("benchmarks/probe.py", "benchmarks/tune_defaults.py", "models",
                      *TRAINING, "training/config.py"),
    "local_cluster": ("infra/cluster/local_cluster.py", "infra/cluster", *AUTOREC, "training",
                      "evaluation/score.py", "evaluation/evaluate.py"),
}
# results computed from other results: stale too when one of those was rewritten after them
DERIVED_FROM = {"nce_report": ("experiment-ml-100k",
                               "experiment-ml-latest-small",
                               "experiment-citeulike-a", "experiment-ml-100k-levers",
                               "experiment-citeulike-a-levers",
                               "experiment-ml-latest-small-levers",
                               "experiment-ml-100k-start", "experiment-ml-latest-small-start",
                               "experiment-citeulike-a-ensemble", "experiment-gowalla-wide",
                               "experiment-gowalla-ensemble", "experiment-gowalla-top"),
                # its full-scale point is the committed yahoo_scale.json
                "projection": ("yahoo_scale",),
                "ensemble_check": ("experiment-gowalla-width", "experiment-gowalla-wide")}

@dataclass
class Verdict:
    name: str
    files: list[Path]       # the result's files (or its folder)
    produced: str           # the commit it ran on (full sha), "" when unknown
    how: str                # "recorded" or "file's commit"
    since: list[str]        # "sha subject" of each later commit changing what it measures


def git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {root}: {out.stderr.strip()}\n"
                           "fix: run from a git clone of the repository (with its history: "
                           "`git fetch --unshallow` in a shallow clone)")
    return out.stdout.strip()


def result_files(root: Path) -> dict[str, list[Path]]:
    """Every committed result, by name: the .json/.md pair of a file stem, or a folder."""
    found: dict[str, list[Path]] = {}
    results, cluster = root / "benchmarks" / "results", root / "infra" / "cluster" / "results"
    for p in sorted(results.iterdir()) if results.is_dir() else []:
        if p.is_dir():
            found[p.name] = [p]
        elif p.suffix in (".json", ".md"):
            found.setdefault(p.stem, []).append(p)
    for p in sorted(cluster.glob("*.md")) if cluster.is_dir() else []:
        found[p.stem] = [p]
    return found


def recorded_commit(files: list[Path]) -> str:
    """The commit a result says it ran on: JSON ``commit`` (``+dirty`` dropped) or a Markdown
    ``Commit: abc1234`` line; "" when it says none."""
    for f in files:
        if f.suffix == ".json":
            try:
                data = json.loads(f.read_text())
            except ValueError:
                continue
            sha = data.get("commit") if isinstance(data, dict) else None
            if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{7,40}(\+dirty|\+uncommitted)?",
                                                     sha):
                return sha.split("+")[0]
    # a Markdown result, or a folder's README (an experiment's "Commit: abc1234 (...)" line)
    for f in [f for f in files if f.suffix == ".md"] + [f / "README.md" for f in files
                                                         if f.is_dir()]:
        if f.is_file():
            m = re.search(r"^Commit: `?([0-9a-f]{7,40})", f.read_text(), re.M)
            if m:
                return m.group(1)
    return ""


def verdict(root: Path, name: str, files: list[Path], measures: tuple[str, ...]) -> Verdict:
    rel = [str(f.relative_to(root)) for f in files]
    sha, how = recorded_commit(files), "recorded"
    if sha:
        try:
            sha = git(root, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}")
        except RuntimeError:  # not in this clone's history (a helper's branch, a rebase)
            sha = ""
    if not sha:
        sha, how = git(root, "log", "-1", "--format=%H", "--", *rel), "file's commit"
    paths = [p for p in measures if (root / p).exists()]
    candidates = git(root, "log", "--no-merges", "--format=%H %s", f"{sha}..HEAD", "--",
                     *paths).splitlines() if sha and paths else []
    since = [f"{c[:7]} {c[41:]}" for c in candidates if changes_code(root, c[:40], paths)]
    return Verdict(name, files, sha, how, since)


def changes_code(root: Path, commit: str, paths: list[str]) -> bool:
    """Whether ``commit`` changed what ``paths`` do: any non-Python file it modified or deleted
    there (a YAML grid only where its parsed values differ), or a Python file whose syntax tree,
    docstrings left out, differs from its parent's (so a commit that only edits comments,
    docstrings or layout does not make a result stale). A file the commit adds does not count:
    code that ran before it existed could only use it through a change to another file, which
    counts (a new grid file beside an experiment's own grid left every experiment stale)."""
    touched = git(root, "diff-tree", "--no-commit-id", "--name-only", "--diff-filter=a", "-r",
                  f"{commit}^", commit, "--", *paths).splitlines()
    return any(_file_changed(root, commit, path) for path in touched)


@functools.cache
def _file_changed(root: Path, commit: str, path: str) -> bool:
    # what is compared: a grid's values (comments left out), a module's syntax tree (docstrings
    # and comments left out), any other file as it is
    meaning = _yaml if path.endswith((".yaml", ".yml")) else _tree if path.endswith(".py") else None
    if meaning is None:
        return True
    before, after = (meaning(root, f"{rev}:{path}") for rev in (f"{commit}^", commit))
    return before is None or after is None or before != after


def _show(root: Path, spec: str) -> str | None:
    """A file's text at a revision (``rev:path``); None where it does not exist."""
    out = subprocess.run(["git", "show", spec], cwd=root, capture_output=True, text=True,
                         timeout=60)
    return out.stdout if out.returncode == 0 else None


def _yaml(root: Path, spec: str) -> str | None:
    """A YAML file's parsed values, as text; None when absent or unparsable."""
    import yaml

    text = _show(root, spec)
    if text is None:
        return None
    try:
        return json.dumps(yaml.safe_load(text), sort_keys=True, default=str)
    except yaml.YAMLError:
        return None


def _tree(root: Path, spec: str) -> str | None:
    """The file's syntax tree without docstrings, as text; None when absent or unparsable."""
    text = _show(root, spec)
    if text is None:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def verdicts(root: Path = ROOT, measures: dict[str, tuple[str, ...]] | None = None,
             derived_from: dict[str, tuple[str, ...]] | None = None) -> list[Verdict]:
    """Every result's verdict (``MEASURES`` and ``DERIVED_FROM`` unless given)."""
    measures = MEASURES if measures is None else measures
    derived_from = DERIVED_FROM if derived_from is None else derived_from
    found = result_files(root)
    unlisted = sorted(set(found) - set(measures))
    if unlisted:
        raise SystemExit(f"results not listed in benchmarks/staleness.py MEASURES: "
                         f"{', '.join(unlisted)}; fix: add each with the paths it measures")
    out = [verdict(root, n, found[n], measures[n]) for n in sorted(found)]
    by_name = {v.name: v for v in out}
    for v in out:  # a report is as old as the oldest result it summarises
        for src in derived_from.get(v.name, ()):
            s = by_name.get(src)
            if s and v.produced and s.produced and s.produced != v.produced and \
                    _is_ancestor(root, v.produced, s.produced):
                v.since.append(f"{s.produced[:7]} rewrote {src}")
    return out


def _is_ancestor(root: Path, a: str, b: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=root,
                          capture_output=True, timeout=60).returncode == 0


def table(rows: list[Verdict]) -> list[str]:
    lines = ["| result | ran on | known from | commits since that change what it measures | "
             "status |", "|---|---|---|---|---|"]
    for v in rows:
        shown = "; ".join(c[:60] for c in v.since[:2]) + (f"; … {len(v.since)} in all"
                                                          if len(v.since) > 2 else "")
        lines.append(f"| {v.name} | {v.produced[:7] or '?'} | {v.how} | {shown or '-'} | "
                     f"{'**stale**' if v.since else 'current'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when any result is stale")
    p.add_argument("--result", metavar="NAME", help="list every later commit for this result")
    args = p.parse_args(argv)
    rows = verdicts()
    if args.result:
        match = [v for v in rows if v.name == args.result]
        if not match:
            p.error(f"--result {args.result}: no such result; known: "
                    f"{', '.join(v.name for v in rows)}")
        v = match[0]
        print(f"{v.name}: ran on {v.produced[:12]} ({v.how}); measures "
              f"{', '.join(MEASURES[v.name])}")
        print("\n".join(v.since) or "no later commit changes it: current")
        return 0
    print("\n".join(table(rows)))
    stale = [v.name for v in rows if v.since]
    print(f"\n{len(stale)} of {len(rows)} results stale" + (f": {', '.join(stale)}" if stale
                                                               else ""))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
