"""Command lines built from config dataclasses: one place for every flag's default, type and help.

    @dataclass(frozen=True)
    class ScoreConfig:
        model: str = option(help="MLflow model URI or a run's model.pt", group="model")
        k: int = option(50, help="recommendations per user")

    parser = argparse.ArgumentParser(allow_abbrev=False)   # strict(): no guessed prefixes
    add_options(parser, ScoreConfig)
    cfg = ScoreConfig(**values(parser.parse_args(argv), ScoreConfig))

A field without a default is a required flag; ``bool`` fields are switches; ``X | None`` fields
default to None (the help says what None means); tuples take one or more values. The flag is the
field name with dashes. ``--help`` shows each default, taken from the dataclass itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from dataclasses import MISSING
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "nce-autorec"

_TYPES = {"int": int, "float": float, "str": str}


def option(default=MISSING, *, help: str, group: str = "", choices=None, metavar: str | None = None,
           short: str | None = None, hidden: bool = False, show_default: bool = True):
    """A dataclass field that is also a command-line flag."""
    meta = {"help": help, "group": group, "choices": choices, "metavar": metavar, "short": short,
            "hidden": hidden, "show_default": show_default}
    if isinstance(default, list | tuple):
        return dataclasses.field(default_factory=lambda: tuple(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def strict_parser(**kwargs) -> argparse.ArgumentParser:
    """A parser that never guesses: ``--epoch`` is an error, not ``--epochs``; it has --version."""
    parser = argparse.ArgumentParser(allow_abbrev=False, **kwargs)
    add_version(parser)
    return parser


def version_text() -> str:
    """``nce-autorec 0.1.0 (git abc1234)``: the installed package's version, plus the commit when
    this code runs from a git checkout (an installed copy has no .git: the version alone)."""
    try:
        text = f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:  # run from a checkout that was never pip-installed
        text = f"{DISTRIBUTION} (not installed)"
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():  # never report the commit of some repository around site-packages
        return text
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git on PATH: the version alone, quietly
        sha = ""
    return f"{text} (git {sha})" if sha else text


class _VersionAction(argparse.Action):
    """argparse's "version" action, but git runs only when --version is asked for, not on every
    parser built (the tests build hundreds)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def add_version(parser: argparse.ArgumentParser) -> None:
    """--version on ``parser``: what to quote in a bug report."""
    parser.add_argument("--version", action=_VersionAction,
                        help="print the package version (and git commit in a checkout) and exit")


def _kind(annotation: str) -> tuple[type | None, bool, bool]:
    """(element type, optional, many) of a field's annotation string."""
    text = annotation.replace(" ", "")
    optional = text.endswith("|None")
    text = text.removesuffix("|None")
    if text.startswith("tuple[") and text.endswith(",...]"):
        return _TYPES[text[len("tuple["):-len(",...]")]], optional, True
    if text == "bool":
        return None, optional, False
    return _TYPES[text], optional, False


def add_options(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per field of ``cls`` that has ``option`` metadata, in field order, grouped."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "help" not in meta:
            continue
        where = parser
        if meta["group"]:
            where = groups.get(meta["group"]) or groups.setdefault(
                meta["group"], parser.add_argument_group(meta["group"]))
        names = [f"--{f.name.replace('_', '-')}"] + ([meta["short"]] if meta["short"] else [])
        element, optional, many = _kind(f.type if isinstance(f.type, str) else f.type.__name__)
        default = (f.default_factory() if f.default_factory is not MISSING else f.default)
        required = default is MISSING
        text = meta["help"]
        # None is left to the help, which says what it means; 0, False and () are shown too
        # (a ``not in (None, False, ())`` test hid 0, which equals False)
        if meta["show_default"] and not required and default is not None:
            if element is None:
                shown = "on" if default else "off"
            elif many:
                shown = ", ".join(map(str, default)) or "none"
            else:
                shown = default
            text += f" (default: {shown})"
        kwargs: dict = {"help": argparse.SUPPRESS if meta["hidden"] else text, "dest": f.name}
        if element is None:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(type=element, choices=meta["choices"],
                          metavar=meta["metavar"] or choices_metavar(meta["choices"]))
            if many:
                kwargs["nargs"] = "+"
            if required:
                kwargs["required"] = True
            else:
                kwargs["default"] = default
        where.add_argument(*names, **kwargs)


def choices_metavar(choices) -> str | None:
    """``{train|train,valid}`` where a choice holds a comma: argparse's own ``{a,b}`` would read
    ``{train,train,valid}``, three choices instead of two."""
    if choices and any("," in str(c) for c in choices):
        return "{" + "|".join(map(str, choices)) + "}"
    return None


def values(args: argparse.Namespace, cls) -> dict:
    """The parsed flags of ``cls``'s option fields, ready for ``cls(**...)``."""
    out = {}
    for f in dataclasses.fields(cls):
        if "help" in f.metadata and hasattr(args, f.name):
            v = getattr(args, f.name)
            out[f.name] = tuple(v) if isinstance(v, list) else v
    return out
