"""Which package may import which (the picture in docs/architecture.md), checked on every
import statement of the project's code, including those inside functions."""

from __future__ import annotations

import ast
import re
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


# what only the AutoRec family has: its classes, its ridge start, its unit of lambda, its loss switch
MODEL_WORDS = ("autorec", "ridge", "overlap", "dense_loss", "finetune", "loss_path", "lam_units")


def code_names(path: Path) -> set[str]:
    """The identifiers ``path``'s code uses (names, attributes, definitions, arguments, keywords
    and imports); docstrings, comments and string values are left out: they may name a model
    as an example, and a model's name is a value the user picks."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.name for a in node.names} | {getattr(node, "module", None) or ""}
    return names


def test_training_reaches_a_model_only_through_the_interface():
    """The generic loop knows no model by name: what is one model's own in training (the AutoRec
    family's ridge start, its unit of lambda and its old records, its loss path and fine-tune
    flags) is behind Recommender's hooks and declarations."""
    bad = [f"{path.relative_to(ROOT)}: {name}" for path in sorted((ROOT / "training").rglob("*.py"))
           for name in sorted(code_names(path))
           if any(word in name.lower() for word in MODEL_WORDS)]
    assert not bad, "training/ names a model's own parts:\n" + "\n".join(bad)


def model_knobs() -> set[str]:
    """Every hyperparameter and training option name the registered models declare."""
    from models.registry import MODELS

    return ({n for c in MODELS.values() for n in c.hyperparameters}
            | {n for c in MODELS.values() for n in c.trainer.options})


def knob_uses(path: Path, knobs: set[str]) -> set[str]:
    """Where ``path``'s code names a model's knob: as an attribute (``cfg.mode``), a keyword
    (``f(lam=...)``), or in a string that is not a docstring (``"pos_weight"``, ``"--width"``,
    an f-string's text "raise --lam"); local variable names are the code's own."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                       ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    flags = {k: re.compile(rf"(^|[^\w-])--{re.escape(k.replace('_', '-'))}(?![\w-])") for k in knobs}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in knobs:
            found.add(f".{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in knobs:
            found.add(f"{node.arg}=")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings):
            found |= {repr(k) for k in knobs if node.value == k}
            found |= {f"--{k}" for k, rx in flags.items() if rx.search(node.value)}
    return found


def test_training_names_no_model_knob():
    """The generic loop and driver know a model's knobs (mode, width, lambda, pos_weight, the
    fine-tune flags) only through the models' declarations and training policies: no attribute,
    keyword or string in training/ names one."""
    knobs = model_knobs() - {"rank"}  # a worker's DDP rank in training/, not PureSVD's rank
    bad = [f"{path.relative_to(ROOT)}: {use}" for path in sorted((ROOT / "training").rglob("*.py"))
           for use in sorted(knob_uses(path, knobs))]
    assert not bad, "training/ names a model's knob:\n" + "\n".join(bad)


def test_the_knob_check_sees_each_kind_of_use(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""--lam in a docstring is fine"""\n'
                 'def f(cfg, width):\n    """mode here too"""\n'
                 '    x = cfg.mode\n    g(pos_weight=1)\n    h["dropout"]\n'
                 '    return f"raise --lam (now {width})", "--lam-units", "a mode"\n')
    assert knob_uses(p, {"mode", "pos_weight", "dropout", "lam", "width", "lam_units"}) == {
        ".mode", "pos_weight=", "'dropout'", "--lam", "--lam_units"}


def test_the_model_name_check_sees_a_model_named(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""ridge in a docstring is fine"""\nfrom models.autorec import AutoRec\n'
                 'def f(model):\n    model.set_ridge_head(1, 2, 3)  # a comment on ridge\n'
                 '    return "nce-autorec", build(overlap=1)\n')
    names = code_names(p)
    assert {"models.autorec", "AutoRec", "set_ridge_head", "overlap"} <= names
    assert not {"nce-autorec", "ridge"} & names


# -- room sizes (issue 55): a module a reader can hold, a function a reader can follow ------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# a longer function says why in its docstring, in one of these words
LONG_REASONS = ("although long", "read top to bottom")


def long_rooms(path: Path) -> list[str]:
    """``path``'s module if over MAX_MODULE_LINES, and its functions over MAX_FUNCTION_LINES whose
    docstring gives no reason."""
    text = path.read_text()
    out = [f"{path.name}: {len(text.splitlines())} lines"] \
        if len(text.splitlines()) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
            doc = " ".join((ast.get_docstring(node) or "").split())
            if not any(r in doc for r in LONG_REASONS):
                out.append(f"{path.name}: {node.name}, {node.end_lineno - node.lineno + 1} lines")
    return out


def test_no_module_or_function_outgrows_its_room():
    found = [r for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
             for r in long_rooms(p)]
    assert not found, ("split these (or give a long function's reason in its docstring: "
                       f"{' / '.join(LONG_REASONS)}): {found}")


def test_the_room_check_sees_a_long_module_and_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_fn = tmp_path / "m.py"
    long_fn.write_text(f"def f():\n    \"\"\"Short.\"\"\"\n{body}\n")
    assert long_rooms(long_fn) == [f"m.py: f, {MAX_FUNCTION_LINES + 2} lines"]
    long_fn.write_text(f"def f():\n    \"\"\"One function although long: why.\"\"\"\n{body}\n")
    assert long_rooms(long_fn) == []
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_rooms(big) == [f"big.py: {MAX_MODULE_LINES + 1} lines"]
