"""The ETL's configuration: one frozen dataclass, and the per-dataset defaults of protocol.md."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from prepared.errors import UsageError
from runtime.cli import option


@dataclass(frozen=True)
class PositiveRule:
    """Which ratings count as positive: ``low (<|<=) rating (<|<=) high``; implicit data: all rows."""

    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None
    high_inclusive: bool = True
    all_rows: bool = False

    @classmethod
    def parse(cls, text: str) -> PositiveRule:
        """``>3``, ``>=3``, ``<=100``, ``80..100`` (both ends inclusive) or ``all``."""
        s = text.replace(" ", "")
        if s == "all":
            return cls(all_rows=True)
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\.\.(-?\d+(?:\.\d+)?)", s)
        if m:
            return cls(low=float(m[1]), high=float(m[2]))
        m = re.fullmatch(r"(>=|>|<=|<)(-?\d+(?:\.\d+)?)", s)
        if m:
            op, v = m[1], float(m[2])
            if op.startswith(">"):
                return cls(low=v, low_inclusive=op == ">=")
            return cls(high=v, high_inclusive=op == "<=")
        raise UsageError(f"--positive {text!r} is not a rule; use one of '>3', '>=3', '80..100', 'all'")

    def __str__(self) -> str:
        if self.all_rows:
            return "all"
        if self.low is not None and self.high is not None:
            return f"{self.low:g}..{self.high:g}"
        if self.low is not None:
            return (">=" if self.low_inclusive else ">") + f"{self.low:g}"
        return ("<=" if self.high_inclusive else "<") + f"{self.high:g}"


@dataclass(frozen=True)
class Layout:
    """A raw format: its name (the key of its reader in ``etl.sources.READERS``) and what the
    pipeline does differently for it, so no stage compares format names."""

    name: str
    generated: bool = False      # no input files: the rows come from etl.synthetic
    named_columns: bool = False  # a header names the columns (--split-col, --user-col, ...)
    one_file: bool = False       # the file's line number is the user id: exactly one file
    rating_255: bool = False     # Yahoo! R1's 255 ("never play again"): checked and counted


LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    Layout("tsv4"), Layout("movielens-csv"), Layout("goodbooks"), Layout("netflix"),
    Layout("yahoo", rating_255=True), Layout("citeulike", one_file=True), Layout("user-items"),
    Layout("csv", named_columns=True), Layout("synthetic", generated=True))}


@dataclass(frozen=True)
class DatasetSpec:
    """How a raw dataset is laid out and what protocol.md prescribes for it."""

    layout: Layout
    default_files: tuple[str, ...]  # looked for when --input is a directory
    positive: str        # default --positive rule
    split: str           # time | random | given
    header: str | None = None
    # the publisher's rating scale (lowest, highest): a rating outside it is a counted bad line
    # (99 on MovieLens' 1..5 was a positive under '>3'); None where there is none to check
    # (one-class data, a user's csv, Yahoo's 0..100 whose 255 has its own check)
    scale: tuple[float, float] | None = None


_L = LAYOUTS
DATASETS: dict[str, DatasetSpec] = {
    "ml-100k": DatasetSpec(_L["tsv4"], ("u.data",), ">3", "time", scale=(1, 5)),
    "ml-latest-small": DatasetSpec(_L["movielens-csv"], ("ratings.csv",), ">3", "time",
                                   header="userId,movieId,rating,timestamp", scale=(0.5, 5)),
    "ml-20m": DatasetSpec(_L["movielens-csv"], ("ratings.csv",), ">3", "time",
                          header="userId,movieId,rating,timestamp", scale=(0.5, 5)),
    "netflix": DatasetSpec(_L["netflix"], ("training_set/mv_*.txt", "combined_data_*.txt"), ">3",
                           "time", scale=(1, 5)),
    "goodbooks": DatasetSpec(_L["goodbooks"], ("ratings.csv",), ">=3", "random",
                             header="user_id,book_id,rating", scale=(1, 5)),
    # The authors' code let 255 ("never play again") through a >= 80 filter; protocol.md does not.
    "yahoo-r1": DatasetSpec(_L["yahoo"], ("ydata-ymusic-user-artist-ratings-v1_0.txt",), "80..100",
                            "random"),
    "citeulike": DatasetSpec(_L["citeulike"], ("users.dat",), "all", "random"),
    # `user item item ...` per line, one-class, usually shipped as train.txt + test.txt
    # (LightGCN/NGCF's gowalla, yelp2018, amazon-book): --split given keeps that split
    "user-items": DatasetSpec(_L["user-items"], ("*.txt",), "all", "random"),
    # LightGCN's Gowalla with LightGCN++'s validation split (train.txt valid.txt test.txt, as
    # python -m etl.fetch gowalla and ../shared/datasets/gowalla hold it): the published split
    "gowalla": DatasetSpec(_L["user-items"], ("*.txt",), "all", "given"),
    "csv": DatasetSpec(_L["csv"], (), ">3", "time"),
    "synthetic": DatasetSpec(_L["synthetic"], (), "all", "time"),
}
DATASET_ALIASES = {"yahoo": "yahoo-r1", "movielens-20m": "ml-20m", "goodbooks-10k": "goodbooks",
                   "citeulike-a": "citeulike", "citeulike-t": "citeulike", "lightgcn": "user-items"}
SPLITS_GIVEN = ("train", "valid", "test")
# how a split may be spelled in a file name or a split column
SPLIT_NAMES = {"train": "train", "training": "train", "valid": "valid", "validation": "valid",
               "val": "valid", "dev": "valid", "test": "test", "testing": "test"}
# file names only: MovieLens-100K's own splits are u1.base / u1.test ... ua.base / ua.test
FILE_SPLIT_NAMES = {**SPLIT_NAMES, "base": "train"}


IO, PROTOCOL, CSV, SYNTHETIC = ("input and output", "protocol (defaults as in protocol.md)",
                                "generic csv (--dataset csv)", "synthetic (--dataset synthetic)")


@dataclass(frozen=True)
class ETLConfig:
    """Every parameter of one ETL run; recorded whole in the manifest. etl/prepare.py's flags are
    built from these fields (``runtime.cli``): their defaults and help live here only."""

    dataset: str = option(help="the dataset's format and protocol defaults (listed below; "
                               "aliases: yahoo, citeulike-a)", group=IO)
    output: str = option(help="the prepared directory itself: its files go directly in OUTPUT "
                              "(local path or URI)", group=IO)
    input: tuple[str, ...] = option((), group=IO, metavar="PATH",
                                    help="raw file(s), a directory holding the dataset's usual "
                                         "file, or a glob")
    name: str | None = option(None, group=IO, show_default=False,
                              help="the dataset's name in the manifest, MLflow experiments and "
                                   "registered models (default: for csv and user-items the "
                                   "input's file or folder name, else --dataset)")
    overwrite: bool = option(False, group=IO, help="replace an existing prepared --output")
    shards: int = option(0, group=IO, show_default=False,
                         help="number of user-row Parquet shards (default: about 500k positives "
                              "each)")
    max_bad_rows: float = option(0.001, group=IO,
                                 help="fail when more than this share of data lines is malformed; "
                                      "below it, malformed lines are skipped, counted and shown")
    seed: int = option(0, group=PROTOCOL, help="seeds the random split, cold users, negatives")
    positive: str | None = option(None, group=PROTOCOL,
                                  help="which ratings are positive: '>3', '>=3', '80..100' or "
                                       "'all' (default: the dataset's, see below)")
    split: str | None = option(None, group=PROTOCOL, choices=["time", "random", "given"],
                               help="per-user split order (default: the dataset's), or 'given': "
                                    "keep the input's split, from a file per split (--input "
                                    "train=PATH test=PATH, or names holding train/valid/test) or "
                                    "from --split-col; validation is carved out of train per user "
                                    "when none is given")
    test_fraction: float = option(0.3, group=PROTOCOL,
                                  help="test share per user: n_test = floor(f n)")
    holdout_fraction: float = option(0.5, group=PROTOCOL,
                                     help="valid+test share per user: n_train = n - floor(f n)")
    cold_users: float | None = option(None, group=PROTOCOL,
                                      help="share of users held out of training entirely (0 "
                                           "allowed; default 0.05, but 0 with --split given: a "
                                           "published split holds no user out)")
    beta: float = option(1.0, group=PROTOCOL, help="R* = max(log Z - beta log pop_j, 0)")
    rstar_z: str = option("users", group=PROTOCOL, choices=["users", "positives"],
                          help="Z in R*: number of training users (authors' code) or of training "
                               "positives (the paper's formula)")
    negatives: int = option(500, group=PROTOCOL,
                            help="negative draws per user, with replacement, by popularity")
    delimiter: str = option(",", group=CSV, help="field separator ('\\t' or 'tab' for tabs)")
    user_col: str = option("user", group=CSV, help="header name of the user column")
    item_col: str = option("item", group=CSV, help="header name of the item column")
    rating_col: str | None = option("rating", group=CSV,
                                    help="rating column ('' for one-class data)")
    time_col: str | None = option("timestamp", group=CSV, help="unix-time column ('' for none)")
    split_col: str | None = option(None, group=CSV,
                                   help="with --split given: the column saying train, valid or "
                                        "test of each row (default: none, each file is one split)")
    users: int = option(10_000, group=SYNTHETIC, help="number of users")
    items: int = option(2_000, group=SYNTHETIC, help="number of items")
    positives: int = option(200_000, group=SYNTHETIC,
                            help="target number of positives (the generated count is close to it)")
    topics: int = option(0, group=SYNTHETIC,
                         help="item topics (clusters a user draws from); 0 = one per 40 items, "
                              "2 to 50. Many small topics make a hard set")
    affinity: float = option(0.8, group=SYNTHETIC,
                             help="share of a user's positives drawn from their topic (the rest "
                                  "by popularity from the whole catalogue)")
    zipf: float = option(1.0, group=SYNTHETIC,
                         help="popularity's Zipf exponent: an item's weight is rank^-zipf")

    def __post_init__(self) -> None:
        object.__setattr__(self, "dataset", dataset_name(self.dataset))  # aliases -> canonical
        # as typed on a command line: a tab, and '' for "no such column"
        object.__setattr__(self, "delimiter", {"\\t": "\t", "tab": "\t"}.get(self.delimiter,
                                                                              self.delimiter))
        for name in ("rating_col", "time_col", "split_col"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, None)
        object.__setattr__(self, "input", tuple(self.input))
        object.__setattr__(self, "name", dataset_label(self.name) if self.name else
                           default_name(self.dataset, self.input))
        if self.split is None and self.spec.split == "given":  # a benchmark published split
            object.__setattr__(self, "split", "given")
        if self.cold_users is None:
            object.__setattr__(self, "cold_users", 0.0 if self.split == "given" else 0.05)
        for name in ("test_fraction", "holdout_fraction", "cold_users", "max_bad_rows"):
            v = getattr(self, name)
            if not (0.0 <= v < 1.0) or math.isnan(v):
                raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {v}")
        if self.test_fraction > self.holdout_fraction:
            raise UsageError(f"--test-fraction ({self.test_fraction}) must not exceed "
                             f"--holdout-fraction ({self.holdout_fraction}), which covers valid + test")
        if self.beta < 0:
            raise UsageError(f"--beta must be >= 0, got {self.beta}")
        if self.negatives < 0:
            raise UsageError(f"--negatives must be >= 0, got {self.negatives}")
        if self.rstar_z not in ("users", "positives"):
            raise UsageError(f"--rstar-z must be 'users' or 'positives', got {self.rstar_z!r}")
        if self.split not in (None, "time", "random", "given"):
            raise UsageError(f"--split must be 'time', 'random' or 'given', got {self.split!r}")
        if self.split_col and not self.spec.layout.named_columns:
            raise UsageError(f"--split-col names a column of --dataset csv; --dataset {self.dataset} "
                             "has no named columns: give a file per split instead (--input "
                             "train=PATH test=PATH)")
        if self.split_col and self.split != "given":
            raise UsageError("--split-col is read only with --split given; add --split given")
        if self.split == "given" and self.spec.layout.generated:
            raise UsageError("--split given needs input files; synthetic data has none")
        if self.spec.layout.generated:
            if min(self.users, self.items, self.positives) < 1:
                raise UsageError("--users, --items and --positives must be >= 1 for synthetic data")
            if self.topics < 0 or not 0 <= self.affinity <= 1 or self.zipf < 0:
                raise UsageError(f"--topics {self.topics}, --affinity {self.affinity}, --zipf "
                                 f"{self.zipf}: need topics >= 0 (0 = automatic), affinity in "
                                 "[0, 1] and zipf >= 0")
        elif not self.input:
            raise UsageError(f"--input is required for --dataset {self.dataset} "
                             f"(a file, a directory holding {' or '.join(self.spec.default_files) or 'it'}, "
                             "or a glob)")
        PositiveRule.parse(self.positive_rule)  # fail early on a bad rule

    @property
    def spec(self) -> DatasetSpec:
        return DATASETS[self.dataset]

    @property
    def positive_rule(self) -> str:
        if self.positive is not None:
            return self.positive
        if self.spec.layout.named_columns and self.rating_col is None:
            return "all"  # a CSV without ratings: every interaction is a positive
        return self.spec.positive

    @property
    def split_mode(self) -> str:
        return self.split if self.split is not None else self.spec.split

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["input"] = list(self.input)
        d["positive"], d["split"] = self.positive_rule, self.split_mode
        return d


def dataset_name(name: str) -> str:
    """Canonical dataset name, or a UsageError listing the valid ones."""
    name = DATASET_ALIASES.get(name, name)
    if name not in DATASETS:
        raise UsageError(f"unknown --dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return name


# file names that say nothing about the data: the folder above names it instead
GENERIC_STEMS = {*FILE_SPLIT_NAMES, "ratings", "rating", "data", "interactions", "u", "users", "all"}


def default_name(dataset: str, inputs: tuple[str, ...]) -> str:
    """The name a dataset gets without --name: a csv's or user-items' input file's stem
    (``shop/events.csv`` -> events), or its folder's when the file name is generic or there are
    several files (``gowalla/train.txt test.txt`` -> gowalla); any other format's --dataset."""
    if dataset not in ("csv", "user-items") or not inputs:
        return dataset
    paths = []
    for item in inputs:
        label, sep, rest = item.partition("=")
        path = rest if sep and label.lower() in SPLIT_NAMES else item
        paths.append(path.rstrip("/").rsplit("/", 1))
    stem = lambda part: part.split(".", 1)[0] if "." in part.lstrip(".") else part
    files = [p[-1] for p in paths]
    folders = {p[0].rsplit("/", 1)[-1] if len(p) > 1 else "" for p in paths}
    wild = any(c in f for f in files for c in "*?[")
    if len(files) == 1 and not wild and "." not in files[0].lstrip("."):
        name = files[0]  # a folder
    elif len(files) == 1 and not wild and stem(files[0]).lower() not in GENERIC_STEMS:
        name = stem(files[0])
    elif len(folders) == 1 and next(iter(folders)) not in ("", ".", ".."):
        name = next(iter(folders))
    else:
        name = stem(files[0])
    return dataset_label(name, fallback=dataset)


def dataset_label(name: str, fallback: str | None = None) -> str:
    """``name`` as it can go into MLflow experiment and registered-model names: letters, digits,
    '.', '_' and '-' (other characters become '-')."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not clean:
        if fallback:
            return fallback
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' or '-'")
    return clean
