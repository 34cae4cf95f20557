"""Which committed results are older than the code they measure.

Every result under ``benchmarks/results`` (and the cluster run's under ``infra/cluster/results``)
is listed in ``MEASURES`` with the paths whose behaviour sets its numbers: the script that wrote it
and the modules it times or whose quality it reports. A result is *stale* when a commit after the
one that produced it touched any of those paths. The producing commit is the one the result
records (``"commit"`` in its JSON, or a ``Commit:`` line in its Markdown); a result that records
none is dated by the last commit that changed its file, which is later than (or equal to) the code
it ran on, so such a result can only look fresher than it is, never staler.

A commit that only edits comments, docstrings or layout of a Python file, or the comments of a
YAML grid, does not count (the syntax tree, or the parsed values, are compared). A commit read
and found unable to change one kind of result's numbers (``REVIEWED``, each with its reason: a
refactor with its parity test, a message's wording, a run's clean-up after it ended) does not
count for that kind (``SPEED`` results are timings, the rest quality), nor one found unable to
change one result's (``REVIEWED_FOR``: a default that result's script always overrides): the
table counts such commits and ``--result NAME`` lists them with their reasons.

    python benchmarks/staleness.py            # the table, all results
    python benchmarks/staleness.py --check    # exit 1 when any result is stale
    python benchmarks/staleness.py --result loss_speed   # every commit since, for one result

Not part of ``make test`` (a code change would fail the suite until every benchmark reran); the
suite checks that every result is listed here (``tests/test_staleness.py``)."""

from __future__ import annotations

import argparse
import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
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
    "floors": ("benchmarks/floors.py",),
    "fold_in": ("benchmarks/fold_in.py", "benchmarks/tune_defaults.py", "models/peruser.py",
                "models/bpr.py", "models/cml.py", "models/cdae.py", "models/topk.py", *TRAINING),
    "fold_in_speed": ("benchmarks/fold_in_speed.py", "models/peruser.py"),
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
    "nce_report": ("benchmarks/nce_report.py",),
    "negative_draws": ("benchmarks/negative_draws.py", "prepared/protocol.py"),
    "peruser_step_speed": ("benchmarks/peruser_step_speed.py", "models/peruser.py"),
    "quality_ml100k": ("benchmarks/quality_ml100k.py", *AUTOREC, *TRAINING),
    "score_throughput": ("benchmarks/score_throughput.py", "evaluation/score.py",
                         "models/serving.py", "models/topk.py", "models/base.py",
                         "models/autorec/model.py"),
    "train_throughput": ("benchmarks/train_throughput.py", *AUTOREC, "training"),
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
    "local_cluster": ("infra/cluster/local_cluster.py", "infra/cluster", *AUTOREC, "training",
                      "evaluation/score.py", "evaluation/evaluate.py"),
}
# results computed from other results: stale too when one of those was rewritten after them
DERIVED_FROM = {"nce_report": ("experiment-ml-100k",
                               "experiment-ml-latest-small",
                               "experiment-citeulike-a", "experiment-ml-100k-levers",
                               "experiment-citeulike-a-levers",
                               "experiment-ml-latest-small-levers"),
                # its full-scale point is the committed yahoo_scale.json
                "projection": ("yahoo_scale",)}

# Results whose numbers are timings; every other result's numbers are quality (what a model
# scores, what a search chose, how a run converged).
SPEED = {"etl_scale", "evaluate_speed", "floors", "fold_in_speed", "fresh_clone",
         "fresh_clone_alone", "fresh_clone_loaded", "fresh_clone_alone_loaded", "loss_speed",
         "negative_draws", "peruser_step_speed", "projection", "score_throughput",
         "train_throughput", "validation_speed", "yahoo_scale", "local_cluster", "demo"}
QUALITY, TIMING = "quality", "speed"
# Commits read one by one and found unable to change the numbers of one kind of result, with the
# reason. Such a commit does not make that kind of result stale; the table counts it. A commit
# goes here only after reading its diff: a refactor its message calls unchanged behaviour, backed
# by the tests it names; a message's wording; a run's clean-up after it ended; a config accepted
# that was refused before (nothing that ran used it). Not here: anything that moves a number of
# that kind even by rounding (a change of units, defaults, a gather rule, a final's lambda).
BOTH = frozenset({QUALITY, TIMING})
REVIEWED: dict[str, tuple[frozenset[str], str]] = {
    "d195c88": (frozenset({QUALITY}), "deletes a finished run's checkpoints after it ended "
                "(model.pt holds the best weights); nothing a run computes changes"),
    "54ad93a": (frozenset({QUALITY}), "refactor (current_final; one warm/cold group per task); "
                "behaviour unchanged, the sharded parity test bit for bit"),
    "ffcccc7": (frozenset({QUALITY}), "models.topk.top_k returns torch.topk's answer, ties "
                "included (tests/test_topk.py); faster, the same lists"),
    "728542b": (BOTH, "one helper for one Spark task per shard, built as before inline; "
                "behaviour unchanged (40 tests)"),
    "0307b6a": (BOTH, "the unhealthy run's advice text is one constant; a label helper"),
    "ea89124": (frozenset({QUALITY}), "scoring writes one file per rows shard; the same per-user "
                "values to the bit (a Spark parity test)"),
    "c8fd1e1": (BOTH, "synthetic data's shape as options whose defaults draw exactly as before; "
                "a report's and a grid's edits outside what these results ran"),
    "666dc77": (frozenset({QUALITY}), "one gather-or-dense rule and one memory share instead of "
                "copies of each; behaviour unchanged"),
    "3899ac3": (BOTH, "a fine-tune final with --finetune-phase1-epochs is accepted where it was "
                "refused; every committed run is one that was accepted before"),
    "2a1d2fc": (BOTH, "nce_report calls ndcg_ci directly; figures read defaults once; the report "
                "regenerates identically"),
    "26a9e47": (BOTH, "an unhealthy run's WARNING names --pos-weight first (message text)"),
    "04cec74": (BOTH, "score.py: one output schema; an unused one removed"),
    "f676fdd": (BOTH, "one commit stamp for every benchmark (metadata, not measurements)"),
    "d0fc23a": (BOTH, "one stamp and one atomic writer for benchmarks (metadata and file "
                "writing)"),
    "d755f7d": (frozenset({QUALITY}), "a finished run's clean-up skips a file it failed on; "
                "nothing a run computes changes"),
    "d33669b": (BOTH, "experiment --register-as, its default the name as before"),
    "77e628b": (BOTH, "experiment figures: unset mode points take the model's default instead of "
                "failing at the end"),
    "06d656a": (BOTH, "the tables' mean ± CI cells through one formatter (same text)"),
    "0c471be": (BOTH, "an f-string in place of format() (same text)"),
    "6dd35a5": (BOTH, "projection.point reads yahoo_scale.STAGES instead of a copy of it"),
    "2f28d70": (BOTH, "fold_in.py writes through report.stamp/publish (the result's own commit)"),
    "5a1b3a7": (frozenset({QUALITY}), "models.topk.top_k by group maxima: the same lists as "
                "torch.topk, ties included (tests/test_topk.py); faster"),
    "18ef8ca": (frozenset({QUALITY}), "top_k's group size from the shape: the same lists as "
                "torch.topk (38 tests against it); faster"),
    "f65dd6a": (BOTH, "the Spark SQL metrics, used by no code path, move to tests/ as the "
                "reference (a test: the path in use equals them bit for bit); docstrings"),
    "7e309c9": (frozenset({QUALITY}), "evaluation writes the per_user rows with pyarrow (the "
                "sharded parity test bit for bit); the seeds' finals run side by side with the "
                "configs they had one after another"),
    "854558f": (BOTH, "prepare() moved from benchmarks/baselines.py to benchmarks/datasets.py "
                "unchanged; the benchmarks import it from there"),
    "4062ad2": (BOTH, "score() destroys its broadcasts when it has written the lists instead of "
                "unpersisting them: the same lists, and a driver-side block removal and a file "
                "unlink added, milliseconds against a scoring stage's tens of seconds"),
    "c2bb0f6": (frozenset({QUALITY}), "negative_counts in blocks: the same draws bit for bit "
                "(a draw-by-draw reference test); faster, so timings move"),
    "503007a": (BOTH, "renames passes._order to passes.lexorder; the same function"),
    "8fd351e": (BOTH, "pipeline._reordered returns its batch apart; the same values"),
}


# Commits read and found unable to change one result's numbers though they change others' (a
# default that this result's script always overrides), by result.
REVIEWED_FOR: dict[str, dict[str, str]] = {
    "fresh_clone_alone": {
        "fe88603": "test_staleness's two tests on tiny git repositories (under 1 s of a 31-min "
                   "suite) and a test docstring",
        "8855f1c": "test_staleness: a helper for two tests' repository set-up (the same tests)",
        "f108252": "tests/test_report.py: three tests of a Markdown line (about 0.01 s)",
        "cdf1a91": "test_figures: tests of figures.formatted and figures.update on tmp files "
                   "(about 0.02 s)",
        "5e65810": "test_figures: three more cases of a parametrised format test",
        "cb4418f": "test_report: one more test of a Markdown line (about 0.01 s)",
        "14fd583": "test_figures and test_report: a few more cases of format tests",
        "976a25b": "test_ray_resources: one more stall-message test on the session's Ray head "
                   "(about 1 s)",
        "1cb2e2a": "test_ray_resources: the stall test's expected wording (same test, same time)"},
    "fresh_clone": {
        "1cb2e2a": "test_ray_resources: the stall test's expected wording (same test, same time)"},
    "batch_defaults": {"2090fc6": "the per-model batch and lr defaults; batch_defaults.py gives "
                                  "every run its batch size and lr (TrainConfig(batch_size=, "
                                  "lr=)), so no run of it reads a default"},
}


def kind(name: str) -> str:
    return TIMING if name in SPEED else QUALITY


def reviewed_for(name: str, sha: str) -> str | None:
    """Why commit ``sha`` cannot change result ``name``'s numbers, or None when not reviewed so."""
    for short, (kinds, why) in REVIEWED.items():
        if sha.startswith(short) and kind(name) in kinds:
            return why
    for short, why in REVIEWED_FOR.get(name, {}).items():
        if sha.startswith(short):
            return why
    return None


@dataclass
class Verdict:
    name: str
    files: list[Path]       # the result's files (or its folder)
    produced: str           # the commit it ran on (full sha), "" when unknown
    how: str                # "recorded" or "file's commit"
    since: list[str]        # "sha subject" of each later commit touching what it measures
    reviewed: list[str] = field(default_factory=list)  # such commits in REVIEWED


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
    touching = [c for c in candidates if changes_code(root, c[:40], paths)]
    since = [f"{c[:7]} {c[41:]}" for c in touching if reviewed_for(name, c) is None]
    reviewed = [f"{c[:7]} {reviewed_for(name, c)}" for c in touching
                if reviewed_for(name, c) is not None]
    return Verdict(name, files, sha, how, since, reviewed)


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


def verdicts(root: Path = ROOT) -> list[Verdict]:
    found = result_files(root)
    unlisted = sorted(set(found) - set(MEASURES))
    if unlisted:
        raise SystemExit(f"results not listed in benchmarks/staleness.py MEASURES: "
                         f"{', '.join(unlisted)}; fix: add each with the paths it measures")
    out = [verdict(root, n, found[n], MEASURES[n]) for n in sorted(found)]
    by_name = {v.name: v for v in out}
    for v in out:  # a report is as old as the oldest result it summarises
        for src in DERIVED_FROM.get(v.name, ()):
            s = by_name.get(src)
            if s and v.produced and s.produced and s.produced != v.produced and \
                    _is_ancestor(root, v.produced, s.produced):
                v.since.append(f"{s.produced[:7]} rewrote {src}")
    return out


def _is_ancestor(root: Path, a: str, b: str) -> bool:
    return subprocess.run(["git", "merge-base", "--is-ancestor", a, b], cwd=root,
                          capture_output=True, timeout=60).returncode == 0


def table(rows: list[Verdict]) -> list[str]:
    lines = ["| result | kind | ran on | known from | commits since that change what it measures | "
             "reviewed as not changing it | status |", "|---|---|---|---|---|---|---|"]
    for v in rows:
        shown = "; ".join(c[:60] for c in v.since[:2]) + (f"; … {len(v.since)} in all"
                                                          if len(v.since) > 2 else "")
        lines.append(f"| {v.name} | {kind(v.name)} | {v.produced[:7] or '?'} | {v.how} | "
                     f"{shown or '-'} | {len(v.reviewed) or '-'} | "
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
        if v.reviewed:
            print("reviewed as unable to change its numbers (REVIEWED):\n  "
                  + "\n  ".join(v.reviewed))
        return 0
    print("\n".join(table(rows)))
    stale = [v.name for v in rows if v.since]
    print(f"\n{len(stale)} of {len(rows)} results stale" + (f": {', '.join(stale)}" if stale
                                                               else ""))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
