"""What a served model accepts: a request's rows checked and turned into the model's input.

A caller (a REST client of ``mlflow models serve``, or ``mlflow.pyfunc.load_model(...).predict``)
knows its users' items by the dataset's own ids, not by the indices the model was trained on, so the
id map travels with the model (the ``item_ids`` artifact, in index order). A request has one of

    item_ids      list per user of the dataset's item ids (strings; whole-number ints are accepted
                  and read as their decimal text, as MovieLens ids are written)
    item_indices  list per user of the model's item indices 0..n_items-1

and the params ``k`` (1..n_items; default 50, or the whole catalogue if smaller),
``exclude_seen`` (default true) and ``unknown_items`` (``refuse``, the default, or ``ignore``).
Every malformed request is refused with one ``ValueError`` that says what is wrong and what is
accepted; nothing is guessed: a negative index never means "the last item", a float is never
truncated, an unknown param is not dropped (``models/pyfunc.py`` sees the ones MLflow drops).

An id the model does not know is refused by default too: a typo or another dataset's ids would
otherwise be answered as if the user had no history. A history may legitimately hold items the
model never saw (items added to the catalogue after training): ``unknown_items=ignore`` leaves them
out and **counts** them (the answer's ``unknown_items`` column), so that one new item does not fail
the user's request.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from prepared.protocol import TOP_K

ID_COLUMN, INDEX_COLUMN = "item_ids", "item_indices"
WEIGHTS, ITEM_IDS = "weights", "item_ids"  # the logged model's artifacts (runtime.tracking)


class ItemIds:
    """The model's items by the dataset's ids: ``ids[i]`` is item index i's id."""

    def __init__(self, ids: Sequence[str]):
        self.ids = np.asarray(ids, dtype=object)
        self.index = {str(v): i for i, v in enumerate(self.ids)}
        if len(self.index) != len(self.ids):
            raise ValueError("the model's item id map repeats an id; it was not written by training")

    def __len__(self) -> int:
        return len(self.ids)


def _is_integer(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool | np.bool_)


def _as_list(row, user: int, column: str) -> list:
    if row is None:
        return []
    if isinstance(row, str | bytes) or not hasattr(row, "__len__"):
        raise ValueError(f"row {user}: {column} must be a list of items, got {type(row).__name__} "
                         f"{row!r}")
    return list(row)


def check_k(k, n_items: int) -> int:
    if not _is_integer(k) or not 1 <= int(k) <= n_items:
        raise ValueError(f"param k={k!r}: give a whole number from 1 to the model's {n_items:,} "
                         "items")
    return int(k)


def indices_of(rows, n_items: int) -> list[np.ndarray]:
    """Per-user index arrays from ``item_indices`` rows; refuses non-integers and out-of-range."""
    out = []
    for user, row in enumerate(rows):
        values = _as_list(row, user, INDEX_COLUMN)
        bad = next((v for v in values if not _is_integer(v) or not 0 <= int(v) < n_items), None)
        if bad is not None:
            what = "not a whole number" if not _is_integer(bad) else "outside the catalogue"
            raise ValueError(f"row {user}: {INDEX_COLUMN} holds {bad!r} ({what}); indices are "
                             f"whole numbers from 0 to {n_items - 1:,}, or send the dataset's ids "
                             f"as {ID_COLUMN}")
        out.append(np.unique(np.asarray(values, np.int64)))  # a repeated item counts once
    return out


UNKNOWN_MODES = ("refuse", "ignore")  # the param unknown_items


def indices_of_ids(rows, ids: ItemIds, unknown_items: str = "refuse"
                   ) -> tuple[list[np.ndarray], list[int]]:
    """Per-user index arrays from ``item_ids`` rows, and how many ids of each were unknown
    (``unknown_items``: refused, or ignored and counted). Ids are strings; a whole-number int is
    read as its decimal text."""
    out, unknown = [], []
    for user, row in enumerate(rows):
        found, missing = [], 0
        for v in _as_list(row, user, ID_COLUMN):
            if _is_integer(v):
                v = str(int(v))
            elif not isinstance(v, str):
                raise ValueError(f"row {user}: {ID_COLUMN} holds {v!r} ({type(v).__name__}); ids "
                                 "are strings (or whole numbers, read as their decimal text)")
            i = ids.index.get(v)
            if i is None and unknown_items == "refuse":
                raise ValueError(f"row {user}: {ID_COLUMN} holds {v!r}, which is not one of the "
                                 f"model's {len(ids):,} items (another dataset's id, or an item "
                                 "added after training?); send the param unknown_items=ignore "
                                 "to leave such items out and count them")
            if i is None:
                missing += 1
            else:
                found.append(i)
        out.append(np.unique(np.asarray(found, np.int64)))  # a repeated item counts once
        unknown.append(missing)
    return out, unknown


def parse(frame, n_items: int, ids: ItemIds | None, params: dict | None
          ) -> tuple[list[np.ndarray], list[int], int, bool]:
    """(per-user item indices, unknown ids per user, k, exclude_seen) of a request (a pandas
    DataFrame with one of ``item_ids`` / ``item_indices``)."""
    params = dict(params or {})
    k = check_k(params.pop("k", min(TOP_K, n_items)), n_items)
    exclude_seen = params.pop("exclude_seen", True)
    if not isinstance(exclude_seen, bool | np.bool_):
        raise ValueError(f"param exclude_seen={exclude_seen!r}: give true or false")
    unknown_items = params.pop("unknown_items", "refuse")
    if unknown_items not in UNKNOWN_MODES:
        raise ValueError(f"param unknown_items={unknown_items!r}: give refuse (the default: an "
                         "unknown id fails the request) or ignore (left out and counted)")
    if params:
        raise ValueError(unknown_params(params))
    columns = [c for c in (ID_COLUMN, INDEX_COLUMN) if c in frame.columns]
    if len(columns) != 1:
        raise ValueError(f"send exactly one of the columns {ID_COLUMN} (the dataset's item ids) or "
                         f"{INDEX_COLUMN} (the model's indices); got {list(frame.columns)}")
    rows = list(frame[columns[0]])
    if columns[0] == INDEX_COLUMN:
        return indices_of(rows, n_items), [0] * len(rows), k, bool(exclude_seen)
    if ids is None:
        raise ValueError(f"this model was logged without its item id map; send {INDEX_COLUMN}")
    indices, unknown = indices_of_ids(rows, ids, unknown_items)
    return indices, unknown, k, bool(exclude_seen)


def unknown_params(names) -> str:
    return (f"unknown param(s) {', '.join(sorted(map(str, names)))}: accepted are k, exclude_seen "
            "and unknown_items")
