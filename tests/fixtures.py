"""Synthetic raw files in the documented Netflix Prize and Yahoo! Music R1 formats.

The real files may not be redistributed; these follow the formats described in
shared/datasets/README.md, with the quirks that matter (day-resolution dates with ties, 255).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd


def random_ratings(n_users: int, n_items: int, per_user: int, seed: int, scale=(1, 6)) -> pd.DataFrame:
    """Distinct (user, item) pairs with ratings and a day each; ids as strings of integers."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(1, n_users + 1):
        k = int(rng.integers(1, per_user + 1))
        for i in rng.choice(np.arange(1, n_items + 1), size=min(k, n_items), replace=False):
            rows.append((str(u * 7), str(int(i)), int(rng.integers(*scale)),
                         int(rng.integers(0, 40))))  # few distinct days: many ties
    df = pd.DataFrame(rows, columns=["user", "item", "rating", "day"])
    day0 = dt.date(2005, 1, 1)
    df["date"] = [(day0 + dt.timedelta(days=d)).isoformat() for d in df.day]
    df["ts"] = [int(dt.datetime(2005, 1, 1, tzinfo=dt.UTC).timestamp()) + 86400 * d
                for d in df.day]
    return df


def write_netflix_training_set(root: Path, df: pd.DataFrame) -> Path:
    """``training_set/mv_0000001.txt``...: ``MovieID:`` then ``CustomerID,Rating,YYYY-MM-DD``."""
    folder = root / "training_set"
    folder.mkdir(parents=True)
    for item, g in df.groupby("item"):
        lines = [f"{item}:"] + [f"{r.user},{r.rating},{r.date}" for r in g.itertuples()]
        (folder / f"mv_{int(item):07d}.txt").write_text("\n".join(lines) + "\n")
    return root


def write_netflix_combined(root: Path, df: pd.DataFrame, n_files: int = 2) -> Path:
    """``combined_data_1.txt``...: the same blocks concatenated, movies split over the files."""
    root.mkdir(parents=True, exist_ok=True)
    items = sorted(df.item.unique(), key=int)
    for k, chunk in enumerate(np.array_split(np.array(items, dtype=object), n_files), start=1):
        lines = []
        for item in chunk:
            lines.append(f"{item}:")
            lines += [f"{r.user},{r.rating},{r.date}" for r in df[df.item == item].itertuples()]
        (root / f"combined_data_{k}.txt").write_text("\n".join(lines) + "\n")
    return root


def write_yahoo(path: Path, df: pd.DataFrame) -> Path:
    """``user<TAB>artist<TAB>rating``, rating 0-100 or 255, no header."""
    path.write_text("".join(f"{r.user}\t{r.item}\t{r.rating}\n" for r in df.itertuples()))
    return path
