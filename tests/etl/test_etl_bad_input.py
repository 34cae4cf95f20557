"""Bad input gets a clear error naming file, line and fix, or is handled and counted; nothing is
half-written."""

import os
from pathlib import Path

import pytest

from etl.config import ETLConfig
from etl.prepare import run
from prepared.errors import InputDataError, UsageError
from tests.etl_helpers import prepare

pytestmark = pytest.mark.spark

CLEAN = [(1, 10, 5, 100), (1, 11, 4, 101), (1, 12, 4, 102), (1, 13, 5, 103), (2, 10, 4, 100),
         (2, 12, 5, 104), (2, 14, 4, 105), (3, 11, 5, 99), (3, 13, 4, 98), (3, 14, 5, 97),
         (4, 10, 5, 90), (4, 11, 2, 91)]


def u_data(rows, sep="\t", end="\n"):
    return end.join(sep.join(str(v) for v in r) for r in rows) + end


def u_data_with(tmp_path, changed: dict[int, bytes | str], extra: list[bytes] = ()):
    """``CLEAN`` as ml-100k's u.data in ``tmp_path`` with the lines ``changed`` (0-based; text or
    raw bytes) replaced and ``extra`` appended; returns its path."""
    f = tmp_path / "u.data"
    lines = [line.encode() for line in u_data(CLEAN).splitlines()]
    for i, line in changed.items():
        lines[i] = line.encode() if isinstance(line, str) else line
    f.write_bytes(b"\n".join([*lines, *extra]) + b"\n")
    return f


def with_lines(spark, tmp_path, changed: dict[int, str], max_bad_rows: float):
    """``u_data_with`` through the ETL: (the file, the prepared output, its manifest's counts)."""
    f = u_data_with(tmp_path, changed)
    out = prepare(spark, tmp_path / "out", dataset="ml-100k", input=(str(f),),
                  max_bad_rows=max_bad_rows, negatives=3, cold_users=0.0)
    return f, out, out.manifest["counts"]


def read_with_lines(spark, tmp_path, changed: dict[int, bytes | str], max_bad_rows: float,
                    extra: list[bytes] = ()):
    """``u_data_with`` through the ETL's reading stage alone (``read_validated``: where bad lines
    are found and counted; the counts reach the manifest as test_malformed_rows_under_the_limit
    checks end to end): (the file, the rows it kept as pandas, the counts)."""
    from etl.pipeline import Progress, read_validated

    f = u_data_with(tmp_path, changed, extra)
    counts = {}
    cfg = ETLConfig(dataset="ml-100k", input=(str(f),), output=str(tmp_path / "out"),
                    max_bad_rows=max_bad_rows)
    rows = read_validated(spark, cfg, [str(f)], Progress(), counts).toPandas()
    return f, rows, counts


def siblings(path: Path):
    return sorted(p.name for p in path.parent.iterdir())


def test_missing_input_names_the_path(tmp_path):
    with pytest.raises(InputDataError, match=r"nope\.data: no such file; check --input"):
        run(ETLConfig(dataset="ml-100k", input=(str(tmp_path / "nope.data"),),
                      output=str(tmp_path / "out")))
    with pytest.raises(InputDataError, match="holds no u.data"):
        run(ETLConfig(dataset="ml-100k", input=(str(tmp_path),), output=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_unreadable_input_says_how_to_fix(tmp_path, monkeypatch):
    f = tmp_path / "u.data"
    f.write_text(u_data(CLEAN))
    f.chmod(0)
    if os.access(f, os.R_OK):  # root reads anything: emulate what a normal user sees
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m: False if str(p) == str(f) else real(p, m))
    with pytest.raises(InputDataError, match="not readable.*chmod"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(tmp_path / "out")))


def test_messy_text_equals_clean_text(spark, tmp_path):
    """Blank and comment lines, trailing spaces, CRLF, no final newline: same result as clean."""
    clean = tmp_path / "clean" / "u.data"
    clean.parent.mkdir()
    clean.write_text(u_data(CLEAN))
    messy_lines = ["# exported 2024-01-01", ""] + [
        "\t".join(map(str, r)) + ("   " if i % 3 == 0 else "") for i, r in enumerate(CLEAN)]
    messy_lines.insert(7, "")
    messy = tmp_path / "messy" / "u.data"
    messy.parent.mkdir()
    messy.write_bytes("\r\n".join(messy_lines).encode())  # CRLF and no newline at the end
    kw = dict(dataset="ml-100k", negatives=5, cold_users=0.0)
    a = prepare(spark, tmp_path / "a", input=(str(clean),), **kw)
    b = prepare(spark, tmp_path / "b", input=(str(messy),), **kw)
    assert b.manifest["counts"]["lines"] == {**a.manifest["counts"]["lines"], "blank": 2, "comment": 1}
    assert a.split.sort_values(["user_id", "item_id"]).values.tolist() == \
        b.split.sort_values(["user_id", "item_id"]).values.tolist()
    assert a.rows.drop(columns=[]).to_json() == b.rows.to_json()


def test_malformed_rows_over_the_limit_fail_with_file_line_and_fix(spark, tmp_path):
    f = tmp_path / "u.data"
    lines = u_data(CLEAN).splitlines()
    lines[2] = "1\t12\t4"            # 3 fields
    lines[5] = "2\t12\tfive\t104"    # non-numeric rating
    lines[8] = "3\t13\t4\tyesterday"  # non-numeric timestamp
    f.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    with pytest.raises(InputDataError) as e:
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(out)), spark)
    msg = str(e.value)
    assert f"{f}:3: expected 4 fields separated by tabs, found 3" in msg
    assert f"{f}:6: rating 'five' in column 3 is not a number" in msg
    assert f"{f}:9: timestamp 'yesterday' in column 4 is not a number" in msg
    assert "--max-bad-rows" in msg and "3 of 12 data lines" in msg
    assert siblings(out) == ["u.data"]  # nothing written, not even a temporary directory


def test_malformed_rows_under_the_limit_are_skipped_and_counted(spark, tmp_path):
    f, out, c = with_lines(spark, tmp_path, {2: "1\t12\t4"}, max_bad_rows=0.1)
    assert c["lines"]["bad"] == 1 and c["rows"] == len(CLEAN) - 1
    assert c["bad_row_examples"][0].startswith(f"{f}:3: expected 4 fields")
    assert ("1", "12") not in set(zip(out.split.user_id, out.split.item_id))


def test_a_rating_that_is_no_finite_number_is_a_counted_bad_line(spark, tmp_path):
    """inf, 1e999 (inf as a double) and NaN parse as numbers; inf used to become a positive."""
    clean = u_data(CLEAN).splitlines()
    f, rows, c = read_with_lines(spark, tmp_path, {
        i: "\t".join([*clean[i].split("\t")[:2], bad, clean[i].split("\t")[3]])
        for i, bad in ((1, "inf"), (3, "1e999"), (5, "NaN"))}, max_bad_rows=0.5)
    assert c["lines"]["bad"] == 3 and c["lines"]["row"] == len(rows) == len(CLEAN) - 3
    assert rows["rating"].between(1, 5).all()
    assert c["bad_row_examples"][0].startswith(
        f"{f}:2: rating 'inf' in column 3 is not a finite number")
    assert any("rating '1e999' in column 3 is not a finite number" in e
               for e in c["bad_row_examples"])


def test_wrong_header_names_file_line_and_fix(spark, tmp_path):
    f = tmp_path / "ratings.csv"
    f.write_text("user,item,rating,ts\n1,2,4.0,100\n")
    with pytest.raises(InputDataError, match=r"ratings.csv line 1: expected the header "
                                             r"'userId,movieId,rating,timestamp'.*--dataset csv"):
        run(ETLConfig(dataset="ml-latest-small", input=(str(f),), output=str(tmp_path / "o")), spark)


def test_duplicates_latest_row_decides_and_string_ids(spark, tmp_path):
    f = tmp_path / "ratings.csv"
    f.write_text("who,what,stars,when\n"
                 "alice,b1,5,10\nalice,b1,1,20\n"      # later rating 1 wins: not positive
                 "alice,b2,1,10\nalice,b2,5,30\n"      # later rating 5 wins: positive
                 "alice,b3,4,40\nbob,b1,4,10\nbob,b2,5,11\nbob,b2,5,11\n"  # exact duplicate
                 "carol,b3,5,12\n")
    out = prepare(spark, tmp_path / "out", dataset="csv", input=(str(f),), user_col="who",
                  item_col="what", rating_col="stars", time_col="when", cold_users=0.0, negatives=2)
    c = out.manifest["counts"]
    assert c["duplicate_rows"] == 3 and c["pairs"] == 6
    assert set(zip(out.split.user_id, out.split.item_id)) == {
        ("alice", "b2"), ("alice", "b3"), ("bob", "b1"), ("bob", "b2"), ("carol", "b3")}
    assert out.users.user_id.tolist() == ["alice", "bob", "carol"]  # string order
    assert c["users_numeric_ids"] is False


def test_csv_missing_column_lists_the_header(spark, tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("u,i,r\n1,2,5\n")
    with pytest.raises(InputDataError, match=r"the columns \['u', 'i', 'r'\]; no column 'user' for "
                                             r"--user-col.*no column 'item' for --item-col"):
        run(ETLConfig(dataset="csv", input=(str(f),), output=str(tmp_path / "o")), spark)


def test_empty_after_thresholding_names_the_rule(spark, tmp_path):
    f = tmp_path / "u.data"
    f.write_text(u_data([(1, 1, 1, 5), (2, 2, 3, 6)]))
    out = tmp_path / "out"
    with pytest.raises(InputDataError, match=r"no positives left .* --positive '>3'"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(out)), spark)
    assert siblings(out) == ["u.data"]


def test_only_comments_is_an_empty_input(spark, tmp_path):
    f = tmp_path / "u.data"
    f.write_text("# nothing here\n\n")
    with pytest.raises(InputDataError, match="no data lines found"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(tmp_path / "o")), spark)


def test_existing_output_needs_overwrite_and_is_replaced_whole(spark, tmp_path):
    f = tmp_path / "u.data"
    f.write_text(u_data(CLEAN))
    out = tmp_path / "out"
    first = prepare(spark, out, dataset="ml-100k", input=(str(f),), cold_users=0.0, negatives=2)
    (out / "stale-file").write_text("from an older run")
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(out)), spark)
    second = prepare(spark, out, dataset="ml-100k", input=(str(f),), cold_users=0.0, negatives=7,
                     overwrite=True)
    assert not (out / "stale-file").exists()
    assert second.manifest["parameters"]["negatives"] == 7 != first.manifest["parameters"]["negatives"]
    assert siblings(out) == ["out", "u.data"]  # no .tmp- or .old- left beside it


def test_overwrite_refuses_a_directory_that_is_not_an_output(spark, tmp_path):
    f = tmp_path / "u.data"
    f.write_text(u_data(CLEAN))
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(UsageError, match="not a previous output"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(precious), overwrite=True), spark)
    assert (precious / "thesis.tex").exists()


def test_failure_after_writing_started_leaves_nothing(spark, tmp_path, monkeypatch):
    """A crash in the last step (after items, users and split were written) publishes nothing."""
    from etl import write

    f = tmp_path / "u.data"
    f.write_text(u_data(CLEAN))

    real = write.write_user_rows

    def boom(split, out_dir, *a, **k):
        real(split, out_dir, *a, **k)  # the shards are written, then the job dies
        raise RuntimeError("disk full")

    monkeypatch.setattr(write, "write_user_rows", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(tmp_path / "out")), spark)
    assert siblings(tmp_path / "out") == ["u.data"]


def test_integer_like_ids_keep_their_exact_text(spark, tmp_path):
    """'007' and '7' are different users; ids are written back exactly as read."""
    f = tmp_path / "u.data"
    f.write_text(u_data([("007", 1, 5, 1), ("007", 2, 5, 2), ("7", 1, 5, 3), ("7", 3, 4, 4),
                         ("-3", 2, 5, 5)]))
    out = prepare(spark, tmp_path / "out", dataset="ml-100k", input=(str(f),), cold_users=0.0,
                  negatives=2)
    assert sorted(out.users.user_id) == ["-3", "007", "7"]
    assert out.users.user_id.tolist() == ["-3", "007", "7"]  # as numbers; the tie 007 = 7 by text
    assert set(out.split.user_id) == {"007", "7", "-3"}
    assert out.manifest["counts"]["users_numeric_ids"] is True


def test_a_partition_without_positives_gets_an_empty_shard(spark, tmp_path):
    """Users whose every rating is below the rule can fill a partition: it has no lists and no
    users, and its shard is written empty (one shard per partition, as always)."""
    lines = [f"{u}\t{i}\t{5 if u < 3 else 1}\t{880000000 + i}" for u in range(12) for i in range(6)]
    f = tmp_path / "u.data"
    f.write_text("\n".join(lines) + "\n")
    out = run(ETLConfig(dataset="ml-100k", input=(str(f),), output=str(tmp_path / "out"),
                        shards=8, negatives=3), spark)
    shards = out["layout"]["row_shards"]
    assert len(shards) == 8 and sum(s["users"] for s in shards) == 3
    assert any(s["users"] == 0 for s in shards)
    assert out["counts"]["users"] == 3 and out["counts"]["users_raw"] == 12


def test_ids_that_would_merge_or_split_silently_are_counted_bad_lines(spark, tmp_path):
    """Two ids of different non-UTF-8 bytes would both read back as U+FFFD (one id); a NUL or
    other control character is invisible; "1.0" beside "1" would be two users. Each is a bad
    line at file:line, counted, with the first examples; "01" stays an id of its own (ids are
    text, as the source wrote them)."""
    f, rows, c = read_with_lines(spark, tmp_path, {
        1: b"\xff1\t11\t4\t101",      # Latin-1, not UTF-8
        3: b"\xfe1\t13\t5\t103",      # another byte: the same U+FFFD once decoded
        5: b"2\t1\x002\t5\t104",      # a NUL inside the item id
        7: b"3.0\t11\t5\t99",         # a float export of user 3
        9: b"3\t1e1\t5\t97"},         # 10 in exponent notation
        max_bad_rows=0.5, extra=[b"01\t10\t5\t120"])  # a leading zero: its own id, kept
    assert c["lines"]["bad"] == 5 and c["lines"]["row"] == len(rows) == len(CLEAN) + 1 - 5
    said = c["bad_row_examples"]
    assert said[0].startswith(f"{f}:2: user id '\ufffd1' is not valid UTF-8 (shown with U+FFFD "
                              "for its bad bytes); re-encode the file as UTF-8 (iconv -f LATIN1 "
                              "-t UTF-8, or its encoding)")
    assert said[1].startswith(f"{f}:4: user id '\ufffd1' is not valid UTF-8")
    assert said[2].startswith(f"{f}:6: item id '1?2' holds a control character (shown as ?); "
                              "remove it")
    assert said[3].startswith(f"{f}:8: user id '3.0' is a number written as a decimal; write ids "
                              "as whole numbers (1, not 1.0) or as text")
    assert said[4].startswith(f"{f}:10: item id '1e1' is a number written as a decimal")
    users = set(rows.user_id)
    assert "01" in users and "1" in users and not any("\ufffd" in u or "." in u for u in users)


def test_a_rating_outside_the_datasets_scale_is_a_counted_bad_line(spark, tmp_path):
    """MovieLens-100K rates 1..5: a 99 (another scale's, or a typo) used to pass '>3' as a
    positive, a 0 to be a negative; both are bad lines naming the scale and the fix."""
    f, rows, c = read_with_lines(spark, tmp_path, {1: "1\t11\t99\t101", 4: "2\t10\t0\t100"},
                                 max_bad_rows=0.5)
    assert c["lines"]["bad"] == 2 and c["lines"]["row"] == len(rows) == len(CLEAN) - 2
    assert c["bad_row_examples"][0].startswith(
        f"{f}:2: rating 99.0 is outside ml-100k's scale 1..5; fix the line, or read the file as "
        "--dataset csv (no scale)")
    assert c["bad_row_examples"][1].startswith(f"{f}:5: rating 0.0 is outside ml-100k's scale")
    assert (1, 11) not in set(zip(rows.user_id, rows.item_id))  # ids read as numbers
