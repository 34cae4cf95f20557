"""A user's own CSV: its name (--name, or the file's), its columns checked before Spark starts with
every problem in one error, quoted fields and ISO-8601 times read as the user wrote them."""

from __future__ import annotations

import pytest

from etl.config import ETLConfig, default_name
from etl.prepare import build_parser, config_from_args, run
from etl.sources import header_names, header_roles
from prepared.errors import InputDataError, UsageError
from tests.etl_helpers import prepare


@pytest.mark.parametrize("inputs, name", [
    (("shop/events.csv",), "events"),
    (("data/ml-latest-small/ratings.csv",), "ml-latest-small"),  # a generic file name
    (("gowalla/train.txt", "gowalla/test.txt"), "gowalla"),  # several files of one folder
    (("train=lightgcn/tr.txt", "test=lightgcn/te.txt"), "lightgcn"),  # labelled splits
    (("var/raw/shop",), "shop"),  # a folder
    (("s3a://bucket/logs/clicks.tsv.gz",), "clicks"),
    (("logs/*.csv",), "logs"),  # a glob: its folder
    (("my shop (2024)!.csv",), "my-shop-2024"),  # made fit for MLflow names
])
def test_a_csv_is_named_after_its_file_or_folder(inputs, name):
    assert default_name("csv", inputs) == name
    assert ETLConfig(dataset="csv", input=inputs, output="o").name == name


def test_other_formats_keep_their_dataset_name_and_name_overrides_it():
    assert ETLConfig(dataset="ml-100k", input=("x/u.data",), output="o").name == "ml-100k"
    assert ETLConfig(dataset="citeulike-a", input=("x",), output="o").name == "citeulike"
    args = build_parser().parse_args(["--dataset", "csv", "--input", "a/b.csv", "--output", "o",
                                      "--name", "Shop Q3"])
    assert config_from_args(args).name == "Shop-Q3"
    with pytest.raises(UsageError, match=r"--name '\?\?': use letters, digits"):
        ETLConfig(dataset="csv", input=("a.csv",), output="o", name="??")


def test_a_csv_without_ratings_counts_every_row_unless_a_rule_is_given():
    cfg = lambda **kw: ETLConfig(dataset="csv", input=("a.csv",), output="o", **kw)
    assert cfg(rating_col="").positive_rule == "all"
    assert cfg().positive_rule == ">3" and cfg(rating_col="", positive=">=1").positive_rule == ">=1"


def test_header_names_read_quotes_and_a_byte_order_mark():
    assert header_names('\ufeff"user id", item ,"a, b"\r\n', ",") == ["user id", "item", "a, b"]
    assert header_names("u\ti\tr\n", "\t") == ["u", "i", "r"]


def roles(header: str, **cols) -> dict:
    cfg = ETLConfig(dataset="csv", input=("r.csv",), output="o", **cols)
    return header_roles(header_names(header, ","), cfg, "r.csv line 1")


def test_columns_are_found_by_name_then_case_insensitively():
    assert roles("timestamp,item,user,rating") == {"user": 2, "item": 1, "rating": 3, "timestamp": 0}
    assert roles("User,Item,Rating", time_col="") == {"user": 0, "item": 1, "rating": 2}


def test_every_missing_column_is_named_in_one_error_with_lookalikes():
    with pytest.raises(InputDataError) as e:
        roles("userId,movieId,stars,when")
    msg = str(e.value)
    assert msg.startswith("r.csv line 1: the header has the columns "
                          "['userId', 'movieId', 'stars', 'when']; ")
    assert "no column 'user' for --user-col (did you mean 'userId'?)" in msg
    assert "no column 'item' for --item-col;" in msg
    assert "no column 'rating' for --rating-col" in msg and "or '' for none" in msg
    assert "no column 'timestamp' for --time-col" in msg
    assert msg.count("no column") == 4


def test_ambiguous_and_shared_columns_are_refused():
    with pytest.raises(InputDataError, match=r"--user-col 'user' matches 2 columns \('User', "
                                             r"'USER'\): rename one"):
        roles("User,USER,item,rating", time_col="")
    with pytest.raises(InputDataError, match=r"column 'x' is given to --user-col and --item-col"):
        roles("x,rating", user_col="x", item_col="x", time_col="")


def test_a_wrong_column_fails_before_spark_starts(tmp_path, monkeypatch):
    import runtime.spark

    def no_spark(*a, **k):
        raise AssertionError("Spark was started for a header Python can read")

    monkeypatch.setattr(runtime.spark, "get_spark", no_spark)
    f = tmp_path / "events.csv"
    f.write_text("customer,product,stars,when\nc1,p1,5,2024-01-01\n")
    with pytest.raises(InputDataError, match=rf"^{f} line 1: .*--user-col.*--item-col"):
        run(ETLConfig(dataset="csv", input=(str(f),), output=str(tmp_path / "o"),
                      rating_col="stars", time_col="when"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv"]  # nothing written


@pytest.mark.spark
def test_quoted_fields_iso_times_and_renamed_columns_in_one_run(spark, tmp_path):
    f = tmp_path / "shop events.csv"
    # quoted ids holding the delimiter and a doubled quote; times as ISO dates, ISO date-times
    # (with a zone) and Unix seconds in one column
    f.write_text('when,"customer",product,stars\n'
                 '2024-01-01,"Smith, J.","Lamp ""Nova"", 40W",5\n'
                 '2024-01-03T10:00:00Z,"Smith, J.",Desk,4\n'
                 '1704326400,"Smith, J.",Chair,5\n'               # 2024-01-04
                 '2024-01-05 09:30:00,"Smith, J.",Shelf,5\n'
                 '2024-01-01,Lee,Desk,5\n2024-01-02,Lee,Chair,4\n2024-01-03,Lee,Shelf,5\n'
                 '2024-01-04,Lee,"Lamp ""Nova"", 40W",5\n'
                 'yesterday,Lee,Rug,5\n')                           # not a time: a bad line
    out = prepare(spark, tmp_path / "out", dataset="csv", input=(str(f),), user_col="customer",
                  item_col="product", rating_col="stars", time_col="when", cold_users=0.0,
                  negatives=2, max_bad_rows=0.2)
    m = out.manifest
    assert m["dataset"] == "shop-events" and m["format"] == "csv"
    assert m["parameters"]["name"] == "shop-events"
    assert m["counts"]["lines"]["bad"] == 1
    assert any("timestamp 'yesterday' in column 1 is neither Unix seconds nor an ISO-8601 date"
               in e for e in m["counts"]["bad_row_examples"])
    assert out.users.user_id.tolist() == ["Lee", "Smith, J."]
    assert set(out.items.item_id) == {'Lamp "Nova", 40W', "Desk", "Chair", "Shelf"}
    # split by time per user (of 4 positives: 2 train, the next valid, the newest test), so the
    # three time forms were ordered as the times they say
    split = {(r.user_id, r.item_id): r.split for r in out.split.itertuples()}
    assert split == {("Smith, J.", 'Lamp "Nova", 40W'): "train", ("Smith, J.", "Desk"): "train",
                     ("Smith, J.", "Chair"): "valid", ("Smith, J.", "Shelf"): "test",
                     ("Lee", "Desk"): "train", ("Lee", "Chair"): "train", ("Lee", "Shelf"): "valid",
                     ("Lee", 'Lamp "Nova", 40W'): "test"}
