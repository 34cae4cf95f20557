"""Result figures quoted in README.md and docs/*.md, tied to the artifact they come from.

A figure is tagged by an HTML comment right after it, invisible when rendered:

    545 s<!-- demo.json seconds.total -->
    0.57x<!-- train_throughput.json results[shape=2x1].speedup -->
    38%<!-- fold_in.json results[0].share *100 -->

The tag names a file under ``benchmarks/results`` (``.json``, or ``.csv`` read as a list of rows)
and a key path into it: ``.`` between keys, ``[3]`` or ``[-1]`` for a list index,
``[field=value,...]`` for the one list element whose fields equal those values (numbers compared
as numbers), and ``["key"]`` for a key that holds a dot or a bracket (evaluate_speed's
``results["yahoo-0.25"].new.evaluate_seconds``). Key paths and numbers may be combined by
``*``, ``/``, ``+`` and ``-`` (a space before each), strictly left to right, for a figure the
file holds only in parts: ``*100`` for a fraction quoted as a percentage, ``a / b`` for a
ratio of two entries, ``4096 / a.users_per_second *1000`` for ms a step. The figure written just
before the tag must agree with the artifact at the precision written: 0.1415 accepts 0.14153, 0.79
does not accept 0.57; an integer's trailing zeros are not significant (19,600 accepts 19,612).

``python benchmarks/figures.py`` lists every tag with the written and the artifact value;
tests/test_figures.py fails on any disagreement, missing file or missing key. After a benchmark
reran, ``python benchmarks/figures.py --update`` rewrites each disagreeing figure to its artifact's
value at the precision and in the style written (``0.79`` -> ``0.57``, ``19,600`` -> ``21,200``)
and lists what it changed: the words around a figure ("faster", "below") are still for a person
to read again.
"""

import argparse
import csv
import json
import operator
import re
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

TAG = re.compile(r"<!--\s*(?P<file>[\w./-]+\.(?:json|csv))\s+(?P<key>.*?)\s*-->")
# An operator has a space before it: names hold '-' (ml-100k) and CSV columns single spaces.
OPERATOR = re.compile(r"\s+([*/+-])\s*")
OPS = {"*": operator.mul, "/": operator.truediv, "+": operator.add, "-": operator.sub}
# The figure at the end of the text before a tag: a sign, digits with thousands commas, decimals,
# an exponent, then at most one unit word glued on or after one space (x, %, s, ms, users/s, GiB).
FIGURE = re.compile(
    r"(?<![\w.+\u2212-])(?P<num>[-+\u2212]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:[eE][-+]?\d+)?)"
    r"(?:\s?[A-Za-z%\u00d7\u00b5/]+)?[*`]*$")
# a bracket: an index, a selector or a quoted key (whose quotes may hold '.', '[' and ']')
BRACKET = r'\[(?:"[^"]*"|[^\]"])*\]'
SELECT = re.compile(rf'^(?P<name>[^\[\]"]*)(?P<brackets>(?:{BRACKET})*)$')


@dataclass(frozen=True)
class Tag:
    """One tagged figure: where it is written, what it says and what it names."""
    doc: str          # path relative to the repository root
    line: int         # 1-based
    text: str         # the comment as written
    written: str      # the figure as written before the tag, '' if none was found
    file: str         # relative to benchmarks/results
    key: str          # key paths and numbers joined by ' * ' and ' / '


class FigureError(Exception):
    """A tag naming a missing file or key, or no figure before it."""


def parse_number(text: str) -> tuple[float, float]:
    """The value of a written figure and half a unit of its last significant digit.

    ``'1,234'`` -> (1234, 0.5); ``'0.1415'`` -> (0.1415, 0.00005); ``'19,600'`` -> (19600, 50);
    ``'−0.0012'`` (a Unicode minus) -> (-0.0012, 0.00005); ``'3e-4'`` -> (0.0003, 0.00005).
    """
    s = text.replace(",", "").replace("\u2212", "-")
    d = Decimal(s)
    if "." not in s and "e" not in s.lower():
        d = d.normalize()  # an integer's trailing zeros are a rounding, not a precision
    exponent = d.as_tuple().exponent
    return float(Decimal(s)), 0.5 * 10.0 ** int(exponent)


def figure_match(before: str) -> re.Match | None:
    """The match of the figure at the end of ``before`` (the line up to the tag): its ``num``
    group is the figure, and its span is where ``update`` rewrites it."""
    return FIGURE.search(before.rstrip())


def written_figure(before: str) -> str:
    """The figure at the end of ``before`` (the line up to the tag), or '' if there is none."""
    m = figure_match(before)
    return m.group("num") if m else ""


def find_tags(doc: Path, root: Path = ROOT) -> list[Tag]:
    """Every tag in one Markdown file, with the figure written before each."""
    tags = []
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        for m in TAG.finditer(line):
            tags.append(Tag(doc=str(doc.relative_to(root)), line=n, text=m.group(0),
                            written=written_figure(line[:m.start()]), file=m.group("file"),
                            key=m.group("key")))
    return tags


def split_key(key: str) -> list[str]:
    """``a.b[x=1.5].c`` -> ['a', 'b', '[x=1.5]', 'c']: dots inside brackets do not split, nor
    do dots or brackets inside quotes (``r["yahoo-0.25"].s`` -> ['r', '["yahoo-0.25"]', 's'])."""
    if key.count('"') % 2:
        raise FigureError(f"unbalanced quote in key {key!r} (write [\"key\"])")
    parts, depth, quoted, cur = [], 0, False, ""
    for ch in key:
        quoted ^= ch == '"'
        depth += ch == "[" and not quoted
        depth -= ch == "]" and not quoted
        if ch == "." and depth == 0 and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        m = SELECT.match(part)
        if not m or (not m.group("name") and not m.group("brackets")):
            raise FigureError(f"malformed key segment {part!r}")
        if m.group("name"):
            out.append(m.group("name"))
        out += re.findall(BRACKET, m.group("brackets"))
    return out


def _same(value, wanted: str) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value) == float(wanted)
        except ValueError:
            return False
    return str(value) == wanted


def step(node, segment: str, where: str):
    """One key segment applied to a JSON node; ``where`` (the path so far) names a failure."""
    quoted = re.fullmatch(r'\["([^"]*)"\]', segment)
    if quoted:  # a dict's key, taken as written between the quotes
        segment = quoted.group(1)
    elif segment.startswith("["):
        inner = segment[1:-1]
        if not isinstance(node, list):
            raise FigureError(f"{where} is not a list, cannot apply {segment}")
        if re.fullmatch(r"-?\d+", inner):
            i = int(inner)
            if not -len(node) <= i < len(node):
                raise FigureError(f"{where} has {len(node)} elements, no index {i}")
            return node[i]
        conds = [c.split("=", 1) for c in inner.split(",")]
        if any(len(c) != 2 for c in conds):
            raise FigureError(f"malformed selector {segment} (write [field=value,...])")
        hits = [e for e in node if isinstance(e, dict)
                and all(f.strip() in e and _same(e[f.strip()], v.strip()) for f, v in conds)]
        if len(hits) != 1:
            raise FigureError(f"{where}{segment} matches {len(hits)} elements, not exactly one")
        return hits[0]
    if not isinstance(node, dict) or segment not in node:
        keys = sorted(node)[:12] if isinstance(node, dict) else type(node).__name__
        hint = ('; a key holding a dot is named as ["key.with.dots"]'
                if isinstance(node, dict) and any("." in k for k in node) else "")
        raise FigureError(f"{where} has no key {segment!r} (has {keys}){hint}")
    return node[segment]


def _number(cell: str):
    try:
        return float(cell)
    except ValueError:
        return cell


def load(file: str, results: Path = RESULTS):
    """A result file: JSON as is, CSV as a list of row dicts with numeric cells as floats."""
    path = results / file
    if not path.is_file():
        raise FigureError(f"no file benchmarks/results/{file}")
    if path.suffix == ".csv":
        with path.open(newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    return json.loads(path.read_text())


def lookup(data, key: str, file: str) -> float:
    """The number one key path names in a loaded result file."""
    node, where = data, file
    for segment in split_key(key):
        node = step(node, segment, where)
        where += segment if segment.startswith("[") else f".{segment}"
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise FigureError(f"{where} is {node!r}, not a number")
    return float(node)


def operand(data, text: str, file: str) -> float:
    try:
        return float(text)
    except ValueError:
        return lookup(data, text, file)


def artifact_value(tag: Tag, results: Path = RESULTS) -> float:
    """The number the tag names: its key paths and numbers combined strictly left to right
    (``a + b /60`` is (a + b) / 60: no precedence to remember)."""
    data = load(tag.file, results)
    parts = OPERATOR.split(tag.key.strip())  # [operand, op, operand, op, ...]
    value = operand(data, parts[0], tag.file)
    for op, text in zip(parts[1::2], parts[2::2]):
        right = operand(data, text, tag.file)
        if op == "/" and right == 0:
            raise FigureError(f"{text} is 0: cannot divide by it")
        value = OPS[op](value, right)
    return value


def check(tag: Tag, results: Path = RESULTS) -> str:
    """'' when the written figure agrees with the artifact, else one line saying why not."""
    head = f"{tag.doc}:{tag.line}: {tag.text}"
    if not tag.written:
        return f"{head}: no figure written right before the tag"
    try:
        value = artifact_value(tag, results)
    except FigureError as e:
        return f"{head}: {e}"
    if not agrees(value, tag.written):
        return f"{head}: written {tag.written}, the artifact says {value:.6g}"
    return ""


def agrees(value: float, written: str) -> bool:
    """Whether ``value`` rounds to the figure ``written`` at the precision written."""
    number, half = parse_number(written)
    return abs(value - number) <= half * (1 + 1e-9) + 1e-12


def formatted(value: float, written: str) -> str | None:
    """``value`` written as ``written`` is: the same decimals (or an integer's rounding:
    ``19,600`` rounds to hundreds, unless that leaves fewer significant digits than it had, or
    than two: ``110`` -> ``83``, ``80`` -> ``67``), thousands commas if it had them, a ``+``
    on a positive value if it had one, and its kind of minus. None for an exponent form (by
    hand)."""
    if "e" in written.lower():
        return None
    _, half = parse_number(written)
    plain = written.replace(",", "").lstrip("+-\u2212")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    if decimals:
        body = f"{abs(value):,.{decimals}f}"
    else:  # the written rounding (19,600: hundreds), but never fewer significant digits
        unit = round(2 * half)  # 1, 10, 100, ...
        digits = max(2, len(str(int(plain)).rstrip("0")))  # as written, and at least two
        unit = min(unit, 10 ** max(0, len(str(int(round(abs(value))))) - digits))
        body = f"{int(round(abs(value) / unit)) * unit:,d}"
    if "," not in written:
        body = body.replace(",", "")
    if float(body.replace(",", "")) == 0:
        return body
    if value < 0:
        return ("\u2212" if "\u2212" in written or written.startswith("+") else "-") + body
    return ("+" if written.startswith("+") else "") + body


def update(doc: Path, results: Path = RESULTS) -> list[str]:
    """Rewrite ``doc``'s disagreeing figures to their artifacts' values (``formatted``); returns
    one line per change (and per figure it could not rewrite). The file is replaced whole."""
    if str(ROOT) not in sys.path:  # run as a script (the docstring's command), not as a module
        sys.path.insert(0, str(ROOT))
    from runtime.atomic import write_text

    lines, changes = doc.read_text().split("\n"), []
    name = str(doc.relative_to(ROOT)) if doc.is_relative_to(ROOT) else doc.name
    for n, line in enumerate(lines):
        for m in reversed(list(TAG.finditer(line))):  # right to left: earlier spans stay put
            head = line[:m.start()]
            fig = figure_match(head)
            if not fig:
                continue
            written = fig.group("num")
            t = Tag(doc=name, line=n + 1, text=m.group(0), written=written,
                    file=m.group("file"), key=m.group("key"))
            try:
                value = artifact_value(t, results)
            except FigureError as e:
                changes.append(f"{name}:{n + 1}: {m.group(0)}: {e} (not changed)")
                continue
            if agrees(value, written):
                continue
            new = formatted(value, written)
            if new is None:
                changes.append(f"{name}:{n + 1}: {written} is in exponent form: update by hand")
                continue
            line = head[:fig.start("num")] + new + head[fig.end("num"):] + line[m.start():]
            changes.append(f"{name}:{n + 1}: {written} -> {new}  ({t.file} {t.key})")
        lines[n] = line
    if any("->" in c for c in changes):
        write_text(doc, "\n".join(lines))
    return changes


def docs(root: Path = ROOT) -> list[Path]:
    """The Markdown files whose figures are checked: the README and docs/*.md."""
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--update", action="store_true",
                   help="rewrite disagreeing figures to their artifacts' values, then list them")
    if p.parse_args(argv).update:
        for doc in docs():
            for change in update(doc):
                print(change)
    bad = 0
    for doc in docs():
        for tag in find_tags(doc):
            problem = check(tag)
            bad += bool(problem)
            try:
                value = f"{artifact_value(tag):.6g}"
            except FigureError:
                value = "?"
            print(problem or f"{tag.doc}:{tag.line}: {tag.written} = {value}  ({tag.file} {tag.key})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
