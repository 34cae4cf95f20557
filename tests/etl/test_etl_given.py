"""``--split given``: benchmarks that ship their own split (a file per split, or a split column).

The expectations come from the fixture files themselves (pandas), not from etl/: which pairs each
split holds, how many validation positives are carved per user (floor(m * 2/7)), and, with
timestamps, exactly which ones (each user's newest train positives, ties by item id).
"""

import numpy as np
import pandas as pd
import pytest

from etl.config import ETLConfig
from etl.sources import labelled_inputs, split_of_name
from prepared.errors import InputDataError, UsageError
from tests.etl_helpers import prepare
from tests.fixtures import random_ratings

pytestmark = pytest.mark.spark


def _pairs(df, split=None):
    if split is not None:
        df = df[df.split == split]
    return set(zip(df.user_id.astype(str), df.item_id.astype(str)))


def _user_items_files(tmp_path, seed=3):
    """LightGCN-style train.txt / test.txt: ``user item item ...`` lines, 0-based ids."""
    rng = np.random.default_rng(seed)
    train, test = {}, {}
    for u in range(60):
        items = rng.choice(200, size=int(rng.integers(2, 30)), replace=False)
        cut = max(1, int(len(items) * 0.8))
        train[u], test[u] = list(items[:cut]), list(items[cut:])
    test[7] = []                           # a user with no test items: a bare "7" line
    test[8] = test[8] + [train[8][0]]      # a leak: a train pair again in test
    write = lambda d: "\n".join(" ".join(map(str, [u, *v])) for u, v in d.items()) + "\n"
    (tmp_path / "train.txt").write_text(write(train))
    (tmp_path / "test.txt").write_text(write(test))
    to_set = lambda d: {(str(u), str(i)) for u, v in d.items() for i in v}
    return to_set(train), to_set(test) - to_set(train)


def test_user_items_files_keep_their_split_and_validation_is_carved(spark, tmp_path):
    train, test = _user_items_files(tmp_path)
    out = prepare(spark, tmp_path / "out", dataset="lightgcn", split="given",
                  input=(str(tmp_path / "train.txt"), str(tmp_path / "test.txt")), negatives=10)

    assert _pairs(out.split, "test") == test
    assert _pairs(out.split, "train") | _pairs(out.split, "valid") == train
    # per user: floor(m * 2/7) of the m given train positives become valid
    m = pd.Series([u for u, _ in train]).value_counts()
    got = out.split[out.split.split == "valid"].groupby("user_id").size()
    want = (m * 2 // 7)
    assert got.reindex(want.index, fill_value=0).astype(int).to_dict() == want.astype(int).to_dict()

    c = out.manifest["counts"]
    assert c["cold_users"] == 0            # a published split holds no user out
    assert c["pairs_in_two_splits"] == 1
    g = c["given_split"]
    assert g["valid"] == "carved from train" and g["valid_fraction_of_train"] == "2/7"
    assert g["valid_order"] == "random" and g["source"] == "files"
    assert g["given_positives"] == {"train": len(train), "test": len(test)}
    assert {i["path"].rsplit("/", 1)[1]: i["split"] for i in out.manifest["inputs"]} == {
        "train.txt": "train", "test.txt": "test"}
    assert out.manifest["parameters"]["split"] == "given"

    again = prepare(spark, tmp_path / "again", dataset="lightgcn", split="given",
                    input=(str(tmp_path),), negatives=10)   # the directory: *.txt, named splits
    assert _pairs(again.split, "valid") == _pairs(out.split, "valid")  # seeded, so the same


def test_movielens_base_and_test_files_carve_the_newest_train_positives(spark, tmp_path):
    df = random_ratings(n_users=40, n_items=50, per_user=25, seed=8)
    df = df.assign(ts=df.ts + df.index)    # distinct times: one newest order
    df["part"] = np.where(np.random.default_rng(0).random(len(df)) < 0.25, "test", "base")
    for part, g in df.groupby("part"):
        rows = [f"{r.user}\t{r.item}\t{r.rating}\t{r.ts}" for r in g.itertuples()]
        (tmp_path / f"u1.{part}").write_text("\n".join(rows) + "\n")
    out = prepare(spark, tmp_path / "out", dataset="ml-100k", split="given", negatives=10,
                  input=(str(tmp_path / "u1.base"), str(tmp_path / "u1.test")))

    pos = df[df.rating > 3]
    assert _pairs(out.split, "test") == set(zip(pos.user[pos.part == "test"], pos.item[pos.part == "test"]))
    want_valid = set()
    for _, g in pos[pos.part == "base"].sort_values("ts").groupby("user"):
        k = len(g) * 2 // 7
        want_valid |= set(zip(g.user[len(g) - k:], g.item[len(g) - k:])) if k else set()
    assert _pairs(out.split, "valid") == want_valid
    assert out.manifest["counts"]["given_split"]["valid_order"] == "time"


def test_csv_split_column_is_kept_as_given(spark, tmp_path):
    df = random_ratings(n_users=30, n_items=40, per_user=20, seed=4)
    df["split"] = np.random.default_rng(1).choice(["train", "Validation", "test"], len(df),
                                                  p=[0.6, 0.15, 0.25])
    f = tmp_path / "ratings.csv"
    df[["user", "item", "rating", "ts", "split"]].rename(columns={"ts": "timestamp"}).to_csv(f, index=False)
    out = prepare(spark, tmp_path / "out", dataset="csv", input=(str(f),), split="given",
                  split_col="split", negatives=10)
    pos = df[df.rating > 3]
    name = {"train": "train", "Validation": "valid", "test": "test"}
    for s in ("train", "valid", "test"):
        sel = pos[pos.split.map(name) == s]
        assert _pairs(out.split, s) == set(zip(sel.user, sel.item))
    assert out.manifest["counts"]["given_split"]["valid"] == "given"
    assert out.manifest["counts"]["given_split"]["source"] == "column split"

    lines = f.read_text().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",holdout"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputDataError, match=r"ratings.csv:6: split 'holdout' in column 5 is not "
                                             r"train, valid or test"):
        prepare(spark, tmp_path / "bad", dataset="csv", input=(str(f),), split="given",
                split_col="split", negatives=10, max_bad_rows=0.0)


def test_given_split_errors_say_what_to_do(tmp_path):
    for name in ("train.txt", "test.txt", "extra.txt", "train_test.txt"):
        (tmp_path / name).write_text("1 2 3\n")
    with pytest.raises(InputDataError, match=r"extra.txt: --split given cannot tell .*\(it names "
                                             r"none\); say it with --input train=PATH"):
        labelled_inputs(ETLConfig(dataset="user-items", output="o", split="given",
                                  input=(str(tmp_path / "train.txt"), str(tmp_path / "extra.txt"))))
    with pytest.raises(InputDataError, match="it says test and train"):
        split_of_name(str(tmp_path / "train_test.txt"))
    with pytest.raises(InputDataError, match="no test file among the inputs"):
        labelled_inputs(ETLConfig(dataset="user-items", output="o", split="given",
                                  input=(str(tmp_path / "train.txt"),)))
    # said explicitly, a name need not hold the split
    got = labelled_inputs(ETLConfig(dataset="user-items", output="o", split="given",
                                    input=(f"train={tmp_path / 'extra.txt'}",
                                           f"test={tmp_path / 'train.txt'}")))
    assert [(p.rsplit("/", 1)[1], s) for p, s in got] == [("extra.txt", "train"), ("train.txt", "test")]
    assert split_of_name("/data/u1.base") == "train" and split_of_name("cf-test-1-users.dat") == "test"
    with pytest.raises(UsageError, match="--split-col is read only with --split given"):
        ETLConfig(dataset="csv", output="o", input=("x",), split_col="split")
    with pytest.raises(UsageError, match="--dataset ml-100k has no named columns"):
        ETLConfig(dataset="ml-100k", output="o", input=("x",), split="given", split_col="split")
    assert ETLConfig(dataset="ml-100k", output="o", input=("x",), split="given").cold_users == 0.0
    assert ETLConfig(dataset="ml-100k", output="o", input=("x",)).cold_users == 0.05
