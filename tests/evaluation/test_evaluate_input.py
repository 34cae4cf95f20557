"""evaluation/evaluate.py refuses malformed recommendation lists on real Spark, before writing
anything: a list that repeats an item (a repeated true item would be a hit at each position, NDCG
and Recall far above 1), a user on two rows, an item outside the catalogue, an unknown user. Each
refusal names the file, the first offending user (in user_id order) and, where there is one, the
item."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluation.evaluate import evaluate
from prepared import schema as S
from prepared.errors import UsageError

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def valid_lists(small_prepared) -> list[tuple[str, list[str]]]:
    """20 users of the dataset, each with 5 distinct catalogue items (a well-formed file)."""
    users = sorted(pd.read_parquet(small_prepared / S.USERS_DIR)[S.USER_ID].astype(str))[:20]
    items = list(pd.read_parquet(small_prepared / S.ITEMS_DIR)
                 .sort_values(S.ITEM_INDEX)[S.ITEM_ID].astype(str))
    return [(u, items[i:i + 5]) for i, u in enumerate(users)]


def write_recs(path: Path, lists: list[tuple[str, list[str]]]) -> Path:
    """A recommendation file as evaluation/score.py's columns, written by hand (no manifest)."""
    pq.write_table(pa.table({"user_id": pa.array([u for u, _ in lists], pa.string()),
                             "item_ids": pa.array([x for _, x in lists],
                                                  pa.list_(pa.string()))}), path)
    return path


def refused(spark, prepared: Path, recs: Path, tmp_path: Path) -> str:
    """The refusal's message; asserts it is one line and that no output was started."""
    with pytest.raises(UsageError) as e:
        evaluate(spark, recs=[str(recs)], data=str(prepared), output=str(tmp_path / "eval"),
                 no_mlflow=True)
    msg = str(e.value)
    assert "\n" not in msg and str(recs) in msg
    # neither the output nor its staging directory (a writer's lock file may remain beside them)
    assert not [p.name for p in tmp_path.iterdir() if p.name == "eval" or p.name.startswith(".eval.tmp")]
    return msg


def test_a_well_formed_file_is_evaluated(spark, small_prepared, valid_lists, tmp_path):
    """The control: the checks pass the file the other tests corrupt (its 20 users named: a
    file of some users is evaluated on those)."""
    recs = write_recs(tmp_path / "recs.parquet", valid_lists)
    m = evaluate(spark, recs=[str(recs)], data=str(small_prepared), output=str(tmp_path / "eval"),
                 no_mlflow=True, users=",".join(u for u, _ in valid_lists))
    assert (tmp_path / "eval" / "manifest.json").exists() and m["rows"]


def test_a_list_that_repeats_an_item_is_refused(spark, small_prepared, valid_lists, tmp_path):
    lists = [(u, x) for u, x in valid_lists]
    for i in (7, 3):  # the item at position 1 again at position 4 (a hit there counts twice)
        u, x = lists[i]
        lists[i] = (u, x[:3] + [x[0]] + x[4:])
    first = min(lists[3][0], lists[7][0])
    item = dict(lists)[first][0]
    msg = refused(spark, small_prepared, write_recs(tmp_path / "recs.parquet", lists), tmp_path)
    assert re.search(rf"2 user\(s\) have a list that repeats an item.* first user {first} repeats "
                     rf"item {item};.*deduplicate", msg), msg


def test_a_user_on_two_rows_is_refused(spark, small_prepared, valid_lists, tmp_path):
    lists = valid_lists + [valid_lists[9], valid_lists[4]]
    first = min(valid_lists[9][0], valid_lists[4][0])
    msg = refused(spark, small_prepared, write_recs(tmp_path / "recs.parquet", lists), tmp_path)
    assert re.search(rf"2 user\(s\) have more than one row.* first user {first};.*one list per "
                     "user", msg), msg


def test_an_item_outside_the_catalogue_is_refused(spark, small_prepared, valid_lists, tmp_path):
    lists = [(u, x) for u, x in valid_lists]
    for i, stray in ((12, "no-such-item"), (5, "zz-not-an-item")):
        u, x = lists[i]
        lists[i] = (u, x[:2] + [stray] + x[3:])
    first = min(lists[12][0], lists[5][0])
    stray = "no-such-item" if first == lists[12][0] else "zz-not-an-item"
    msg = refused(spark, small_prepared, write_recs(tmp_path / "recs.parquet", lists), tmp_path)
    data = re.escape(str(small_prepared))
    assert re.search(rf"2 user\(s\) have items outside the catalogue of --data {data}, "
                     rf"first user {first} with item {stray};.*evaluation/score.py", msg), msg


def test_an_unknown_user_is_refused(spark, small_prepared, valid_lists, tmp_path):
    lists = valid_lists + [("zz-nobody", valid_lists[0][1]), ("nobody", valid_lists[1][1])]
    msg = refused(spark, small_prepared, write_recs(tmp_path / "recs.parquet", lists), tmp_path)
    data = re.escape(str(small_prepared))
    assert re.search(rf"2 user\(s\) are not users of --data {data}, e.g. nobody "
                     r"\(the first by user_id\); score the dataset", msg), msg
