"""Which package may import which (the picture in docs/architecture.md), checked on every
import statement of the project's code, including those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("prepared", "runtime", "models", "etl", "training", "evaluation", "experiment",
            "infra")

# package -> the project packages (or modules) it may import
ALLOWED = {
    # the prepared-data contract: schema, protocol arithmetic, the reader, errors
    "prepared": {"prepared"},
    # Spark session, atomic publishing, MLflow tracking, logging
    "runtime": {"runtime", "prepared"},
    # the MLflow pyfunc ships models/ and prepared/ only (runtime.tracking.log_final's code_paths)
    "models": {"models", "prepared"},
    "etl": {"etl", "prepared", "runtime"},
    "training": {"training", "models", "prepared", "runtime"},
    "evaluation": {"evaluation", "models", "prepared", "runtime"},
    # the protocol's orchestrator: search and retrain (training/), then score and evaluate
    # (evaluation/) in one process, above both stages
    "experiment": {"experiment", "training", "evaluation", "models", "prepared", "runtime"},
    "infra": set(PACKAGES),
}
# the top of the project: no package below it imports it
IMPORTS_EXPERIMENT = {"experiment", "infra"}


def project_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from models import base" imports models.base
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in PACKAGES}
    return found


def allowed(module: str, rules: set[str]) -> bool:
    return any(module == r or module.startswith(r + ".") or r.startswith(module + ".")
               for r in rules)


def test_no_package_imports_what_the_architecture_forbids():
    bad = []
    for pkg, rules in ALLOWED.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for module in sorted(project_imports(path)):
                if module.split(".")[0] == "experiment" and pkg not in IMPORTS_EXPERIMENT:
                    bad.append(f"{path.relative_to(ROOT)} imports {module} (the orchestrator)")
                elif not allowed(module, rules):
                    bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "forbidden imports (see docs/architecture.md):\n" + "\n".join(bad)


def test_the_checker_sees_a_forbidden_import(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from training.train import run\n")
    assert project_imports(p) == {"training.train", "training.train.run"}
    assert not allowed("training.train", ALLOWED["models"])
    assert allowed("prepared.reader", ALLOWED["evaluation"])
    assert not allowed("experiment.run", ALLOWED["training"])
    assert not allowed("evaluation.score", ALLOWED["training"])
    assert allowed("evaluation.score", ALLOWED["experiment"])
