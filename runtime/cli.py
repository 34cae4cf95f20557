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

``add_config_file(parser, ScoreConfig)`` adds ``--config FILE``: a YAML mapping of option names
(``lam_units`` or ``lam-units``) whose values become the parser's defaults, so that a flag given
beside it wins. ``config_yaml`` writes such a file from a configuration (a run's, resolved), so
that every run can be repeated from the file it logged.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import subprocess
import sys
from dataclasses import MISSING
from importlib import metadata
from pathlib import Path

from prepared.errors import UsageError

DISTRIBUTION = "nce-autorec"

_TYPES = {"int": int, "float": float, "str": str}


def finite_float(text: str) -> float:
    """argparse's type for every float flag: NaN and the infinities are refused here, since they
    pass any range check after (``nan < 0`` and ``nan > 1`` are both false)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"want a finite number, got {text}")
    return value


def option(default=MISSING, *, help: str, group: str = "", choices=None, metavar: str | None = None,
           short: str | None = None, hidden: bool = False, show_default: bool = True,
           flag: str | None = None, renamed_from: str | None = None):
    """A dataclass field that is also a command-line flag: ``--FIELD-NAME``, or ``--FLAG`` when
    ``flag`` names it otherwise. ``renamed_from``: the flag's former name, still taken (off
    --help) with a note saying the new one, so that scripts keep working while they change."""
    meta = {"help": help, "group": group, "choices": choices, "metavar": metavar, "short": short,
            "hidden": hidden, "show_default": show_default, "flag": flag,
            "renamed_from": renamed_from}
    if isinstance(default, list | tuple):
        return dataclasses.field(default_factory=lambda: tuple(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def strict_parser(**kwargs) -> argparse.ArgumentParser:
    """A parser that never guesses: ``--epoch`` is an error, not ``--epochs``; it has --version
    (and --config FILE once ``add_config_file`` is called)."""
    parser = _ConfigFileParser(allow_abbrev=False, **kwargs)
    add_version(parser)
    return parser


def stage_parser(prog: str, doc: str, cls) -> argparse.ArgumentParser:
    """The command line of a stage that runs on Ray and logs to MLflow (training/train.py, and
    experiment/run.py on top of it with its own config class): ``doc``'s first paragraph as the
    description and the rest as the epilog, one flag per field of ``cls``, --config FILE, and
    where to connect (``add_connection_flags``)."""
    p = strict_parser(prog=prog, description=doc.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=doc.split("\n\n", 1)[1])
    add_options(p, cls)
    add_config_file(p, cls)
    add_connection_flags(p)
    return p


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    """--mlflow-uri and --ray-address: where to connect, not part of any configuration."""
    g = p.add_argument_group("connections (not part of the run's configuration)")
    g.add_argument("--mlflow-uri", default=None,
                   help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite under "
                        "./mlflow/state)")
    g.add_argument("--ray-address", default=None,
                   help="Ray cluster to join (default: $RAY_ADDRESS, else a local Ray)")


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
    """One flag per field of ``cls`` that has ``option`` metadata, in field order, grouped (the
    groups in the order of ``cls.option_groups`` where it has one, else as first met)."""
    groups = {name: parser.add_argument_group(name) for name in getattr(cls, "option_groups", ())}
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if "help" not in meta:
            continue
        where = parser
        if meta["group"]:
            where = groups.get(meta["group"]) or groups.setdefault(
                meta["group"], parser.add_argument_group(meta["group"]))
        names = [flag_of(f)] + ([meta["short"]] if meta["short"] else [])
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
            kwargs.update(type=finite_float if element is float else element,
                          choices=meta["choices"],
                          metavar=meta["metavar"] or choices_metavar(meta["choices"]))
            if many:
                kwargs["nargs"] = "+"
            if required:
                kwargs["required"] = True
            else:
                kwargs["default"] = default
        where.add_argument(*names, **kwargs)
        if meta.get("renamed_from"):
            where.add_argument(f"--{meta['renamed_from']}", **{
                **{k: v for k, v in kwargs.items() if k not in ("required", "default", "action")},
                **({"nargs": 0} if element is None else {}),
                "help": argparse.SUPPRESS, "action": _renamed(names[0]),
                "default": argparse.SUPPRESS})


def flag_of(f: dataclasses.Field) -> str:
    """The command-line flag of an ``option`` field."""
    return "--" + (f.metadata.get("flag") or f.name.replace("_", "-"))


def config_key(f: dataclasses.Field) -> str:
    """The key of an ``option`` field in a --config file: its flag as --help names it, without
    the dashes, ``_`` for ``-`` (``runs_dir`` for the field ``output``)."""
    return flag_of(f)[2:].replace("-", "_")


def _renamed(new: str) -> type[argparse.Action]:
    """An action for a flag's former name: stores as the new one does, and says the new name."""

    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, value, option_string=None):
            print(f"note: {option_string} is now {new} (same meaning); {option_string} will "
                  "go", file=sys.stderr)
            setattr(namespace, self.dest, True if self.nargs == 0 else value)  # 0: a switch

    return Renamed


def choices_metavar(choices) -> str | None:
    """``{train|train,valid}`` where a choice holds a comma: argparse's own ``{a,b}`` would read
    ``{train,train,valid}``, three choices instead of two."""
    if choices and any("," in str(c) for c in choices):
        return "{" + "|".join(map(str, choices)) + "}"
    return None


#: where a parse records the fields given on its command line or in its --config file
GIVEN = "given_fields"


def given(args: argparse.Namespace) -> frozenset[str] | None:
    """The fields the command line or its --config file set (not left to their defaults); None
    for a namespace that no ``strict_parser`` parsed."""
    return getattr(args, GIVEN, None)


def values(args: argparse.Namespace, cls) -> dict:
    """The parsed flags of ``cls``'s option fields, ready for ``cls(**...)``."""
    out = {}
    for f in dataclasses.fields(cls):
        if "help" in f.metadata and hasattr(args, f.name):
            v = getattr(args, f.name)
            out[f.name] = tuple(v) if isinstance(v, list) else v
    return out


# -- --config FILE: a YAML file of options, the flags beside it override it -----------------------

class _ConfigFileParser(argparse.ArgumentParser):
    """An ArgumentParser that reads ``--config FILE`` first and parses the command line over it.

    The file's values go into the namespace before parsing, where argparse takes them as the
    defaults: an explicit flag still replaces them (argparse sets a default only where the
    namespace has no value yet). Every caller of ``parse_args`` gets this, tests included, so no
    code path can take --config and silently ignore it."""

    config_cls = None  # set by add_config_file

    def error(self, message: str):
        """One line and the fix, not argparse's full usage (30 lines for train.py) above the
        message: a mistyped flag gets the flags it is closest to."""
        lines = [f"{self.prog}: error: {message}"]
        unknown = message.split("unrecognized arguments: ", 1)
        # another error (a missing DIR) comes before argparse's unknown flags: they are looked
        # for in the command line itself, so that `--hel` still gets its guess
        words = unknown[1].split() if len(unknown) == 2 else [
            w for w in getattr(self, "_argv", []) if w.startswith("--")
            and w.split("=", 1)[0] not in self._option_string_actions]
        for word in words:
            close = close_flags(word, self._option_string_actions)
            if close:
                lines.append(f"  {word.split('=', 1)[0]}: did you mean {' or '.join(close)}?")
        lines.append(f"(`{self.prog} --help` lists every flag)")
        self.exit(2, "\n".join(lines) + "\n")

    def parse_known_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        self._argv = argv  # for error()
        path = _config_path(argv) if self.config_cls is not None else None
        if path is None or {"-h", "--help"} & set(argv):  # --help never needs the file
            parsed, rest = super().parse_known_args(argv, namespace)
            setattr(parsed, GIVEN, self._on_line(argv))
            return parsed, rest
        settings = read_config(path, self.config_cls, self)
        namespace = namespace if namespace is not None else argparse.Namespace()
        for name, value in settings.items():
            if not hasattr(namespace, name):
                setattr(namespace, name, value)
        # a required flag the file gives is no longer missing; argparse checks only the
        # command line, so it is made optional for this parse alone
        relaxed = [a for a in self._actions if a.required and a.dest in settings]
        for a in relaxed:
            a.required = False
        try:
            parsed, rest = super().parse_known_args(argv, namespace)
        finally:
            for a in relaxed:
                a.required = True
        setattr(parsed, GIVEN, self._on_line(argv) | set(settings))
        return parsed, rest

    def _on_line(self, argv: list[str]) -> frozenset[str]:
        """The fields whose flags ``argv`` names (``--lr 1e-3`` and ``--lr=1e-3`` alike)."""
        words = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
        return frozenset(a.dest for a in self._actions if words & set(a.option_strings))


def add_config_file(parser: argparse.ArgumentParser, cls) -> None:
    """--config FILE on a ``strict_parser``: defaults for ``cls``'s options from a YAML file."""
    if not isinstance(parser, _ConfigFileParser):
        raise TypeError("add_config_file needs a parser made by strict_parser")
    parser.config_cls = cls
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="read options from a YAML file (a run's config.yaml, or "
                             "`epochs: 20` lines); flags beside it win")


def close_flags(word: str, flags) -> list[str]:
    """The flags among ``flags`` that ``word`` (``--epoch``, ``--lamda=3``) most likely meant;
    none for a value or a word far from every flag."""
    if not word.startswith("--"):
        return []
    return difflib.get_close_matches(word.split("=", 1)[0], [f for f in flags if f.startswith("--")],
                                     n=2, cutoff=0.75)


def _config_path(argv: list[str]) -> str | None:
    """The last --config's value on the command line (argparse's rule: the last one counts)."""
    path = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
    return path


_NAMES = {int: "an integer", float: "a number", str: "a string"}


def read_config(path: str, cls, parser: argparse.ArgumentParser | None = None) -> dict:
    """The options of the YAML file ``path``, checked and converted as their flags would be:
    {field name: value}. Raises UsageError naming the file, the line and the fix."""
    import yaml

    where = f"--config {path}"
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file; check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: cannot be read ({getattr(e, 'strerror', None) or e}); pass "
                         "a YAML text file") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and not isinstance(node, yaml.MappingNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a single value"
            raise UsageError(f"{where}: holds {kind}, not a mapping of options; write one "
                             "`option: value` a line, e.g. `epochs: 20`")
        pairs = [] if node is None else [
            (k.start_mark.line + 1, loader.construct_object(k, deep=True),
             loader.construct_object(v, deep=True)) for k, v in node.value]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(f"{where}: not valid YAML{at}: {e.problem or e.context}; fix it there "
                         "(one `option: value` a line)") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{where}: not valid YAML ({str(e).splitlines()[0]}); write one "
                         "`option: value` a line") from None
    finally:
        loader.dispose()
    fields = {f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata}
    # a key may be the field's name or its flag's (``runs_dir`` / ``runs-dir`` for ``output``)
    aliases = {config_key(f): name for name, f in fields.items()}
    other_flags = {a.dest for a in parser._actions} - set(fields) if parser else set()
    out, lines = {}, {}
    for line, key, value in pairs:
        at = f"{where}, line {line}"
        name = key.replace("-", "_") if isinstance(key, str) else key
        name = aliases.get(name, name)
        if name in other_flags:
            raise UsageError(f"{at}: {key} is not part of a configuration file; pass "
                             f"--{name.replace('_', '-')} on the command line instead")
        if name not in fields:
            close = difflib.get_close_matches(str(name), list(fields), n=1)
            hint = f"did you mean {close[0].replace('_', '-') if '-' in str(key) else close[0]}? " \
                if close else ""
            raise UsageError(f"{at}: unknown option {key!r}; {hint}rename or remove it (the "
                             "options are --help's flags, without the leading dashes)")
        if name in out:
            raise UsageError(f"{at}: {key} is given twice (also on line {lines[name]}); keep one")
        try:
            out[name] = _convert(value, fields[name])
        except ValueError as e:
            raise UsageError(f"{at}: {key}: {e}") from None
        lines[name] = line
    return out


def _convert(value, f: dataclasses.Field):
    """``value`` as the flag of field ``f`` would give it (a list for a tuple field); raises
    ValueError saying what was expected."""
    element, optional, many = _kind(f.type if isinstance(f.type, str) else f.type.__name__)
    if value is None:
        if optional:
            return None
        raise ValueError(f"expected {_what(element, many)}, got null; write one (null is "
                         "only for the options whose default is none)")
    if element is None:
        if isinstance(value, bool):
            return value
        raise ValueError(f"expected true or false, got {_shown(value)}; write one of them")
    if many:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError(f"expected {_what(element, many)}, got an empty list; give at "
                             "least one")
        return [_scalar(v, element, f.metadata["choices"], many) for v in items]
    return _scalar(value, element, f.metadata["choices"], many)


def _shown(value) -> str:
    """A value as the file wrote it: strings quoted, the rest (a date, a list) plain."""
    return repr(value) if isinstance(value, str) else str(value)


def _what(element, many: bool) -> str:
    if element is None:
        return "true or false"
    return f"a list of {_NAMES[element].split(' ', 1)[1]}s" if many else _NAMES[element]


def _scalar(value, element: type, choices, many: bool):
    """One value of type ``element``. Numbers may come as strings, as on the command line (YAML
    1.1, PyYAML's, reads ``1e-3`` without a dot as a string); a string option refuses a number,
    which YAML may have changed (``1.10`` is 1.1): quoted, it stays as written."""
    fix = f"quote it: '{value}'" if element is str and not isinstance(value, list | dict) \
        else f"write {_what(element, False)}"
    bad = ValueError(f"expected {_what(element, many)}, got {_shown(value)}; {fix}")
    if isinstance(value, bool | list | dict):
        raise bad
    if element is str:
        if not isinstance(value, str):
            raise bad
    elif element is int and isinstance(value, float):
        raise bad
    else:
        try:
            value = element(value)
        except (TypeError, ValueError):
            raise bad from None
        if element is float and not math.isfinite(value):  # YAML's .nan, .inf
            raise ValueError(f"expected a finite number, got {_shown(value)}; write one")
    if choices and value not in choices:
        raise ValueError(f"{value!r} is not one of {', '.join(map(str, choices))}; write one "
                         "of them")
    return value


def config_yaml(settings: dict, cls, header: str = "", leave_out=()) -> str:
    """``settings`` (field name -> value) as a file ``--config`` reads back: every option of
    ``cls`` but the hidden ones and ``leave_out``, in --help's order and groups, under ``header``
    as comments."""
    import yaml

    groups: dict[str, dict] = {}
    for f in dataclasses.fields(cls):
        if "help" in f.metadata and not f.metadata["hidden"] and f.name not in leave_out:
            v = settings[f.name]
            groups.setdefault(f.metadata["group"], {})[config_key(f)] = \
                list(v) if isinstance(v, tuple) else v
    parts = ["".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())]
    for group, items in groups.items():
        parts.append((f"\n# -- {group}\n" if group else "")
                     + yaml.safe_dump(items, sort_keys=False, default_flow_style=False,
                                      allow_unicode=True, width=2**16))
    return "".join(parts)
