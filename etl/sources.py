"""Raw dataset readers: every supported layout becomes one DataFrame of parsed lines.

Each reader returns ``file, line, gpos, kind, error, text, user_id, item_id, rating, timestamp``
where ``kind`` is one of ``row`` (a rating), ``bad`` (malformed: ``error`` says why), or a line that is
skipped by design (``blank``, ``comment``, ``header``, ``movie`` for Netflix's ``MovieID:`` lines).
Ids stay strings. ``rating`` is null for one-class data, ``timestamp`` (unix seconds) where the
source has no time. Line numbers are 1-based per file, so every error can point at its line.
Under ``--split given`` a last column ``given`` is the split a row was given (0 train, 1 valid,
2 test: ``prepared.schema.SPLITS``), from its file's name or ``--split-col``; otherwise null.
"""

from __future__ import annotations

import csv
import difflib
import glob
import os
import re
from urllib.parse import unquote, urlparse

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from etl.config import FILE_SPLIT_NAMES, SPLIT_NAMES, ETLConfig
from prepared.errors import InputDataError
from prepared.schema import SPLITS

# ---------------------------------------------------------------------------------------------
# Input files
# ---------------------------------------------------------------------------------------------

def _is_local(path: str) -> bool:
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or len(scheme) == 1  # len 1: a Windows drive letter


def _local(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def resolve_inputs(cfg: ETLConfig) -> list[str]:
    """Concrete input files for ``cfg``: ``--input`` may name files, directories or globs.

    Local paths are checked here, so that a typo fails in a second with the fix, not inside Spark.
    Remote URIs (s3a://, hdfs://) are passed to Spark as they are.
    """
    return [f for f, _ in labelled_inputs(cfg)]


def labelled_inputs(cfg: ETLConfig) -> list[tuple[str, str | None]]:
    """``(file, split)`` per input file; ``split`` is None unless each file is one given split
    (``--split given`` without ``--split-col``): said as ``--input test=PATH``, else read from the
    file's name (``train.txt``, ``cf-test-1-users.dat``, ``u1.base``)."""
    per_file = cfg.split == "given" and not cfg.split_col
    out: list[tuple[str, str | None]] = []
    for item in cfg.input:
        label, path = _split_prefix(item) if per_file else (None, item)
        for f in _resolve_one(cfg, path, item):
            out.append((f, label or (split_of_name(f) if per_file else None)))
    for f, _ in out:
        if _is_local(f) and not os.access(_local(f), os.R_OK):
            raise InputDataError(f"{f}: file is not readable by this user; fix its permissions "
                                 f"(chmod a+r) or copy it somewhere readable")
    if cfg.spec.layout.one_file and len(out) != 1 and not per_file:
        raise InputDataError(f"citeulike takes one users.dat (its line number is the user id), "
                             f"got {len(out)} files: {[f for f, _ in out][:3]}")
    if per_file and "test" not in {label for _, label in out}:
        raise InputDataError(
            f"--split given: no test file among the inputs ({', '.join(f for f, _ in out)[:300]}); "
            "pass the benchmark's test file too, e.g. --input train=PATH test=PATH")
    return out


def _split_prefix(item: str) -> tuple[str | None, str]:
    """``test=PATH`` -> ("test", PATH); anything else -> (None, item)."""
    name, sep, rest = item.partition("=")
    if sep and name.lower() in SPLIT_NAMES:
        return SPLIT_NAMES[name.lower()], rest
    return None, item


def split_of_name(path: str) -> str:
    """The split a file's name says: one of its words is train/valid/test (or a synonym)."""
    words = re.split(r"[^a-z0-9]+", os.path.basename(unquote(path)).lower())
    found = sorted({FILE_SPLIT_NAMES[w] for w in words if w in FILE_SPLIT_NAMES})
    if len(found) != 1:
        said = f"it says {' and '.join(found)}" if found else "it names none"
        raise InputDataError(
            f"{path}: --split given cannot tell which split this file holds from its name ({said}); "
            "say it with --input train=PATH valid=PATH test=PATH, or use --split-col for a CSV "
            "with a split column")
    return found[0]


def _resolve_one(cfg: ETLConfig, item: str, typed: str) -> list[str]:
    """The files one ``--input`` value names (a file, a directory or a glob)."""
    if not _is_local(item):
        return [item]
    path = os.path.abspath(os.path.expanduser(_local(item)))
    if os.path.isdir(path):
        found: list[str] = []
        for pattern in cfg.spec.default_files:
            found = sorted(glob.glob(os.path.join(path, pattern)))
            if found:
                break
        if not found:
            wanted = " or ".join(cfg.spec.default_files) or "a file name"
            raise InputDataError(
                f"{path}: directory holds no {wanted} for --dataset {cfg.dataset}; "
                f"pass the ratings file itself with --input, or check --dataset")
        return found
    if any(ch in path for ch in "*?["):
        found = sorted(glob.glob(path))
        if not found:
            raise InputDataError(f"{path}: the pattern matches no file; check --input")
        return found
    if not os.path.exists(path):
        raise InputDataError(f"{path}: no such file; check --input (got {typed!r})")
    return [path]


# ---------------------------------------------------------------------------------------------
# Lines with numbers
# ---------------------------------------------------------------------------------------------

def read_lines(spark: SparkSession, files: list[str]) -> DataFrame:
    """``file, line, gpos, text`` for every physical line of ``files``.

    ``line`` is 1-based per file; ``gpos`` numbers all lines of all files (in file-name order), the
    input order that breaks ties between duplicate rows.

    Spark's text source gives no line numbers. Every row knows its file and the byte offset of its
    split (``_metadata.file_block_start``), and ``monotonically_increasing_id`` numbers the rows of a
    partition consecutively, so a line's number is (lines in the earlier splits of its file) +
    (its position in its split). Counting lines per split is one cheap aggregation; the offsets
    are summed on the driver (a few rows per file) and broadcast back. CRLF, CR and a missing
    final newline are handled by Hadoop's line reader.
    """
    raw = (spark.read.format("text").load(files)
           # local files as plain paths in messages, not file: URIs
           .select(F.regexp_replace("_metadata.file_path", "^file:(?=/)", "").alias("file"),
                   F.col("_metadata.file_block_start").alias("block"),
                   F.monotonically_increasing_id().alias("rid"),
                   F.col("value").alias("text")))
    blocks = raw.groupBy("file", "block").agg(F.min("rid").alias("first_rid"),
                                               F.count(F.lit(1)).alias("n")).collect()
    offsets, seen, total = [], {}, 0
    for b in sorted(blocks, key=lambda r: (r["file"], r["block"])):
        if b["file"] not in seen:
            seen[b["file"]] = 0
            file_start = total
        offsets.append((b["file"], b["block"], b["first_rid"], seen[b["file"]], file_start))
        seen[b["file"]] += b["n"]
        total += b["n"]
    if not offsets:
        return spark.createDataFrame([], "file string, line long, gpos long, text string")
    table = spark.createDataFrame(
        offsets, "file string, block long, first_rid long, done long, file_start long")
    line = F.col("done") + F.col("rid") - F.col("first_rid") + 1
    return (raw.join(F.broadcast(table), ["file", "block"])
            .select("file", line.alias("line"), (F.col("file_start") + line).alias("gpos"), "text"))


# ---------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------

def _clean(text: Column) -> Column:
    # trailing spaces, CR left over from mixed endings, and a UTF-8 byte-order mark
    return F.trim(F.regexp_replace(text, "^\ufeff|\r", ""))


def _field(fields: Column, i: int, quoted: bool = False) -> Column:
    # get(): null past the end (getItem fails under ANSI mode, and short lines are expected here)
    if not quoted:
        return F.trim(F.regexp_replace(F.get(fields, i), '^"|"$', ""))
    # a quoted CSV field ("a, b") may have spaces around its quotes and writes a quote as two
    value = F.regexp_replace(F.trim(F.get(fields, i)), '^"|"$', "")
    return F.trim(F.regexp_replace(value, '""', '"'))


# a delimiter outside double quotes: an even number of quotes follows it to the end of the line
OUTSIDE_QUOTES = '(?=(?:[^"]*"[^"]*")*[^"]*$)'


def _first_error(*checks: tuple[Column, Column]) -> Column:
    out = F.lit(None).cast("string")
    for cond, msg in reversed(checks):
        out = F.when(cond, msg).otherwise(out)
    return out


def _number_error(value: Column, parsed: Column, what: str, col: int,
                  says: str = "not a number") -> tuple[Column, Column]:
    return (value.isNotNull() & (value != "") & parsed.isNull(),
            F.format_string(f"{what} '%s' in column {col} is {says}", value))


def _finite_error(value: Column, parsed: Column, what: str, col: int) -> tuple[Column, Column]:
    # "inf", "1e999" and "NaN" parse as doubles; as ratings they would pass (or fail) any
    # threshold by accident (inf became a positive)
    return (parsed.isNotNull() & (F.isnan(parsed) | (F.abs(parsed) == F.lit(float("inf")))),
            F.format_string(f"{what} '%s' in column {col} is not a finite number", value))


def _delimited(lines: DataFrame, delim: str, n_fields: int, roles: dict[str, int],
               header: bool, quoted: bool = False) -> DataFrame:
    """Parse delimiter-separated lines; ``roles`` maps user/item/rating/timestamp to 0-based columns.
    ``quoted`` (the generic CSV): a field in double quotes may hold the delimiter, and the time
    may be Unix seconds or an ISO-8601 date or date-time (in the session's time zone unless it
    says its own)."""
    text = _clean(F.col("text"))
    sep = "\t" if delim == "\t" else _regex_escape(delim)
    fields = F.split(text, sep + OUTSIDE_QUOTES if quoted else sep, -1)
    get = {role: _field(fields, i, quoted) for role, i in roles.items()}
    rating_raw = get.get("rating", F.lit(None).cast("string"))
    time_raw = get.get("timestamp", F.lit(None).cast("string"))
    rating = rating_raw.try_cast("double")
    timestamp = time_raw.try_cast("long")
    if quoted:
        timestamp = F.coalesce(timestamp, F.try_to_timestamp(time_raw).cast("long"))
    given = _split_code(F.lower(get["split"])) if "split" in roles else None
    delim_name = {"\t": "tabs", ",": "commas", ";": "semicolons"}.get(delim, repr(delim))
    col = {role: i + 1 for role, i in roles.items()}
    error = _first_error(
        (F.size(fields) != n_fields,
         F.format_string(f"expected {n_fields} fields separated by {delim_name}, found %d",
                         F.size(fields))),
        (get["user"] == "", F.lit(f"empty user id in column {col['user']}")),
        (get["item"] == "", F.lit(f"empty item id in column {col['item']}")),
        *([_number_error(rating_raw, rating, "rating", col["rating"]),
           _finite_error(rating_raw, rating, "rating", col["rating"])] if "rating" in roles else []),
        *([_number_error(time_raw, timestamp, "timestamp", col["timestamp"],
                         "neither Unix seconds nor an ISO-8601 date" if quoted else "not a number")]
          if "timestamp" in roles else []),
        *([(given.isNull(), F.format_string(
            f"split '%s' in column {col['split']} is not train, valid or test", get["split"]))]
          if "split" in roles else []),
    )
    kind = (F.when(text == "", "blank").when(text.startswith("#"), "comment")
            .when(F.lit(header) & (F.col("line") == 1), "header")
            .when(error.isNotNull(), "bad").otherwise("row"))
    return lines.select(
        "file", "line", "gpos", kind.alias("kind"),
        F.when(kind == "bad", error).alias("error"), F.col("text"),
        get["user"].alias("user_id"), get["item"].alias("item_id"),
        rating.alias("rating"), timestamp.alias("timestamp"),
        *([given.alias("given")] if "split" in roles else []))


def _split_code(name: Column) -> Column:
    """0 train, 1 valid, 2 test for a split's name (or a synonym); null for anything else."""
    codes = F.create_map(*[F.lit(x) for k, v in SPLIT_NAMES.items() for x in (k, SPLITS.index(v))])
    return F.get(F.map_values(F.map_filter(codes, lambda k, _: k == name)), 0).cast("byte")


def _regex_escape(s: str) -> str:
    return "".join("\\" + c if c in r".^$*+?{}[]\|()" else c for c in s)


def _netflix(lines: DataFrame) -> DataFrame:
    """``MovieID:`` lines, each followed by ``CustomerID,Rating,YYYY-MM-DD`` lines (both layouts)."""
    text = _clean(F.col("text"))
    movie = F.regexp_extract(text, r"^(\d+):$", 1)
    fields = F.split(text, ",", -1)
    date_raw = _field(fields, 2)
    day = F.try_to_timestamp(date_raw, F.lit("yyyy-MM-dd"))
    rating_raw = _field(fields, 1)
    rating = rating_raw.try_cast("double")
    # The movie of a rating line is the latest MovieID line above it in the same file.
    w = Window.partitionBy("file").orderBy("line").rowsBetween(Window.unboundedPreceding, 0)
    with_movie = lines.withColumn("movie", F.when(movie != "", movie)).withColumn(
        "current_movie", F.last("movie", ignorenulls=True).over(w))
    error = _first_error(
        (F.col("current_movie").isNull(), F.lit("rating line before any 'MovieID:' line")),
        (F.size(fields) != 3,
         F.format_string("expected 'CustomerID,Rating,YYYY-MM-DD' (3 fields), found %d fields",
                         F.size(fields))),
        (_field(fields, 0) == "", F.lit("empty customer id in column 1")),
        _number_error(rating_raw, rating, "rating", 2),
        (day.isNull(), F.format_string("date '%s' in column 3 is not YYYY-MM-DD", date_raw)),
    )
    kind = (F.when(text == "", "blank").when(text.startswith("#"), "comment")
            .when(F.col("movie").isNotNull(), "movie")
            .when(error.isNotNull(), "bad").otherwise("row"))
    return with_movie.select(
        "file", "line", "gpos", kind.alias("kind"), F.when(kind == "bad", error).alias("error"), "text",
        _field(fields, 0).alias("user_id"), F.col("current_movie").alias("item_id"),
        rating.alias("rating"), day.cast("long").alias("timestamp"))


def _citeulike(lines: DataFrame) -> DataFrame:
    """``users.dat``: line k (1-based) is user k-1: ``n item_1 ... item_n``; every pair is positive."""
    text = _clean(F.col("text"))
    tokens = F.split(text, r"\s+", -1)
    declared = F.get(tokens, 0).try_cast("int")
    listed = F.size(tokens) - 1
    error = _first_error(
        (declared.isNull(), F.format_string("item count '%s' in column 1 is not a number",
                                            F.get(tokens, 0))),
        (declared != listed, F.format_string("line declares %d items but lists %d",
                                             declared, listed)),
    )
    kind = (F.when(text == "", "blank").when(error.isNotNull(), "bad")
            .when(declared == 0, "blank").otherwise("row"))
    parsed = lines.select(
        "file", "line", "gpos", kind.alias("kind"), F.when(kind == "bad", error).alias("error"), "text",
        (F.col("line") - 1).cast("string").alias("user_id"),
        F.when(kind == "row", F.slice(tokens, 2, F.greatest(listed, F.lit(1)))).alias("items"))
    return parsed.select(
        "file", "line", "gpos", "kind", "error", "text", "user_id",
        F.explode_outer("items").alias("item_id"),
        F.lit(None).cast("double").alias("rating"), F.lit(None).cast("long").alias("timestamp"))


def _user_items(lines: DataFrame) -> DataFrame:
    """``user item item ...`` per line (LightGCN/NGCF's train.txt and test.txt); one-class. A line
    with a user and no items (a user without test items) holds no rows."""
    text = _clean(F.col("text"))
    tokens = F.split(text, r"\s+", -1)
    kind = (F.when(text == "", "blank").when(text.startswith("#"), "comment")
            .when(F.size(tokens) < 2, "blank").otherwise("row"))
    parsed = lines.select(
        "file", "line", "gpos", kind.alias("kind"), F.lit(None).cast("string").alias("error"),
        "text", F.get(tokens, 0).alias("user_id"),
        F.when(kind == "row", F.slice(tokens, 2, F.greatest(F.size(tokens) - 1, F.lit(1))))
        .alias("items"))
    return parsed.select(
        "file", "line", "gpos", "kind", "error", "text", "user_id",
        F.explode_outer("items").alias("item_id"),
        F.lit(None).cast("double").alias("rating"), F.lit(None).cast("long").alias("timestamp"))


def check_headers(lines: DataFrame, expected: str, dataset: str) -> None:
    """Fail unless line 1 of every file is ``expected`` (case and spaces ignored)."""
    firsts = lines.where(F.col("line") == 1).select("file", "text").collect()
    norm = lambda s: s.replace("\ufeff", "").replace(" ", "").replace('"', "").strip().lower()
    for row in firsts:
        if norm(row["text"] or "") != norm(expected):
            raise InputDataError(
                f"{row['file']} line 1: expected the header '{expected}' of --dataset {dataset}, "
                f"found '{(row['text'] or '').strip()[:120]}'. Check --dataset; for a CSV with other "
                f"columns use --dataset csv --user-col ... --item-col ... --rating-col ... --time-col ...")


ROLE_FLAGS = {"user": "--user-col", "item": "--item-col", "rating": "--rating-col",
              "timestamp": "--time-col", "split": "--split-col"}
COMPRESSED = (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate", ".xz")


def header_names(text: str, delimiter: str) -> list[str]:
    """A CSV header line's column names: quoted names allowed, a byte-order mark and the spaces
    around each name dropped."""
    row = next(csv.reader([text.replace("\ufeff", "").rstrip("\r\n")], delimiter=delimiter), [])
    return [c.strip() for c in row]


def header_roles(names: list[str], cfg: ETLConfig, where: str) -> dict[str, int]:
    """The 0-based column of each role (user, item, rating, timestamp, split) in ``names``. A
    column is found by its exact name, else by a case-insensitive one; every column that is
    missing or ambiguous is named in one error, with the header's names that look like it."""
    wanted = {"user": cfg.user_col, "item": cfg.item_col, "rating": cfg.rating_col,
              "timestamp": cfg.time_col, "split": cfg.split_col}
    roles, problems = {}, []
    for role, name in wanted.items():
        if not name:
            continue
        exact = [i for i, n in enumerate(names) if n == name]
        folded = [i for i, n in enumerate(names) if n.lower() == name.lower()]
        found = exact or folded
        if len(found) == 1:
            roles[role] = found[0]
            continue
        if found:
            problems.append(f"{ROLE_FLAGS[role]} {name!r} matches {len(found)} columns "
                            f"({', '.join(repr(names[i]) for i in found)}): rename one in the file")
            continue
        like = [n for n in names if name.lower() in n.lower() or n.lower() in name.lower()]
        like += [n for n in difflib.get_close_matches(name, names, 3, 0.6) if n not in like]
        hint = f" (did you mean {' or '.join(repr(n) for n in like[:3])}?)" if like else ""
        none = " or '' for none" if role in ("rating", "timestamp") else ""
        problems.append(f"no column {name!r} for {ROLE_FLAGS[role]}{hint}; set "
                        f"{ROLE_FLAGS[role]} to one of the header's names{none}")
    shared = {}
    for role, i in roles.items():
        shared.setdefault(i, []).append(role)
    problems += [f"column {names[i]!r} is given to {' and '.join(ROLE_FLAGS[r] for r in rs)}: "
                 "each role needs its own column" for i, rs in shared.items() if len(rs) > 1]
    if problems:
        raise InputDataError(f"{where}: the header has the columns {names}; "
                             + "; ".join(problems))
    return roles


def check_local_headers(files: list[str], cfg: ETLConfig) -> None:
    """Check the named columns against line 1 of every local, uncompressed input, read here in
    Python: a wrong column fails in a second, before Spark starts. Remote and compressed files
    are checked by ``csv_roles`` once Spark reads them."""
    for f in files:
        if not _is_local(f) or f.lower().endswith(COMPRESSED):
            continue
        try:
            with open(_local(f), encoding="utf-8", errors="replace", newline="") as fh:
                first = fh.readline()
        except OSError:
            continue  # unreadable: the reader names the file and the fix
        if first.strip():
            header_roles(header_names(first, cfg.delimiter), cfg, f"{f} line 1")


def csv_roles(lines: DataFrame, cfg: ETLConfig) -> tuple[dict[str, int], int]:
    """Column positions of the generic CSV's named columns, read from its header line."""
    firsts = lines.where(F.col("line") == 1).select("file", "text").collect()
    if not firsts:
        raise InputDataError(f"{cfg.input}: the input is empty; a CSV needs a header line")
    headers = {row["file"]: header_names(row["text"], cfg.delimiter) for row in firsts}
    names = next(iter(headers.values()))
    for f, other in headers.items():
        if other != names:
            raise InputDataError(f"{f} line 1: header {other} differs from {names} of the other files")
    return header_roles(names, cfg, f"{firsts[0]['file']} line 1"), len(names)


def parse(spark: SparkSession, cfg: ETLConfig, files: list[str],
          labels: dict[str, str] | None = None) -> DataFrame:
    """Parsed lines of ``files`` for ``cfg.dataset``'s layout (see the module docstring);
    ``labels``: the split each file was given (``labelled_inputs``), else None."""
    parsed = _checked_scale(_checked_ids(_parse_layout(spark, cfg, files)), cfg)
    if "given" in parsed.columns:  # from --split-col
        return parsed
    return parsed.withColumn("given", _file_split(parsed, labels) if labels else
                             F.lit(None).cast("byte"))


def mark_bad(parsed: DataFrame, error: Column) -> DataFrame:
    """``parsed`` with the rows where ``error`` (null elsewhere; it should test ``kind == 'row'``)
    is set made bad lines with that message: what every check after parsing adds."""
    return (parsed.withColumn("error", F.coalesce(F.col("error"), error))
            .withColumn("kind", F.when(error.isNotNull(), "bad").otherwise(F.col("kind"))))


def _checked_scale(parsed: DataFrame, cfg: ETLConfig) -> DataFrame:
    """Rows whose rating is outside the dataset's published scale (``DatasetSpec.scale``) become
    counted bad lines: a 99 on MovieLens' 1..5 would pass '>3' as a positive."""
    scale = cfg.spec.scale
    if scale is None:
        return parsed
    low, high = scale
    rating = F.col("rating")
    error = F.when((F.col("kind") == "row") & rating.isNotNull()
                   & ((rating < low) | (rating > high)),
                   F.format_string(f"rating %s is outside {cfg.dataset}'s scale {low:g}..{high:g}; "
                                   "fix the line, or read the file as --dataset csv (no scale)",
                                   rating.cast("string")))
    return mark_bad(parsed, error)


CONTROL = "[\\x00-\\x1f\\x7f]"  # (Java regex) C0 controls and DEL: invisible, and a NUL ends C strings
# a number in decimal or exponent notation: a float column's export of integer ids ("1.0" beside
# "1" would be two users); ids are text, so "01" and "1" stay two ids, as the source wrote them
DECIMAL = "^[+-]?([0-9]+[.][0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$|^[+-]?[0-9]+[eE][+-]?[0-9]+$"


def _checked_ids(parsed: DataFrame) -> DataFrame:
    """Rows whose user or item id would be silently wrong become counted bad lines (first
    examples shown, ``--max-bad-rows``): bytes that are not UTF-8 (two different ones would both
    read back as U+FFFD: one id), control characters, a number written as a decimal."""
    checks = []
    for role in ("user", "item"):
        v = F.col(f"{role}_id")
        shown = F.regexp_replace(F.make_valid_utf8(v), CONTROL, "?")
        checks += [
            # Spark's text reader turns bytes that are not UTF-8 into U+FFFD as it reads (a
            # source that holds U+FFFD itself was already damaged by a decoder)
            (v.contains("\ufffd") | ~F.is_valid_utf8(v), F.format_string(
                f"{role} id '%s' is not valid UTF-8 (shown with U+FFFD for its bad bytes); "
                "re-encode the file as UTF-8 (iconv -f LATIN1 -t UTF-8, or its encoding)", shown)),
            (v.rlike(CONTROL), F.format_string(
                f"{role} id '%s' holds a control character (shown as ?); remove it", shown)),
            ((v.contains(".") | v.contains("e") | v.contains("E")) & v.rlike(DECIMAL),  # cheap first
             F.format_string(
                f"{role} id '%s' is a number written as a decimal; write ids as whole numbers "
                "(1, not 1.0) or as text", v))]
    error = F.when(F.col("kind") == "row", _first_error(*checks))
    return mark_bad(parsed, error)


def _file_split(parsed: DataFrame, labels: dict[str, str]) -> Column:
    """Each row's split from its file. Spark names a local file as a path that may be
    percent-encoded; both sides are compared decoded."""
    decoded = {unquote(_local(f)): SPLITS.index(label) for f, label in labels.items()}
    seen = [r["file"] for r in parsed.select("file").distinct().collect()]
    pairs = []
    for f in seen:
        code = decoded.get(unquote(f))
        if code is None:
            raise InputDataError(f"{f}: read by Spark but not among the labelled inputs "
                                 f"{sorted(decoded)[:5]}; pass each file with its split: "
                                 "--input train=PATH test=PATH")
        pairs += [F.lit(f), F.lit(code)]
    return F.create_map(*pairs)[F.col("file")].cast("byte") if pairs else F.lit(None).cast("byte")


def _csv(lines: DataFrame, cfg: ETLConfig) -> DataFrame:
    roles, n = csv_roles(lines, cfg)
    return _delimited(lines, cfg.delimiter, n, roles, True, quoted=True)


MOVIELENS = {"user": 0, "item": 1, "rating": 2, "timestamp": 3}
UIR = {"user": 0, "item": 1, "rating": 2}
# each file layout's reader (etl.config.LAYOUTS): the text lines of the inputs -> parsed rows
READERS = {
    "tsv4": lambda lines, cfg: _delimited(lines, "\t", 4, MOVIELENS, False),
    "movielens-csv": lambda lines, cfg: _delimited(lines, ",", 4, MOVIELENS, True),
    "goodbooks": lambda lines, cfg: _delimited(lines, ",", 3, UIR, True),
    "yahoo": lambda lines, cfg: _delimited(lines, "\t", 3, UIR, False),
    "csv": _csv,
    "netflix": lambda lines, cfg: _netflix(lines),
    "citeulike": lambda lines, cfg: _citeulike(lines),
    "user-items": lambda lines, cfg: _user_items(lines),
}


def _parse_layout(spark: SparkSession, cfg: ETLConfig, files: list[str]) -> DataFrame:
    lines = read_lines(spark, files)
    if cfg.spec.header:
        check_headers(lines, cfg.spec.header, cfg.dataset)
    return READERS[cfg.spec.layout.name](lines, cfg)
