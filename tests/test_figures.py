"""Every result figure the README and docs/ tag with its artifact (``545 s<!-- demo.json
seconds.total -->``, see benchmarks/figures.py) agrees with that artifact at the precision written;
a tag naming a missing file or key fails with the doc, line and tag. Reads files only."""

import json

import pytest

from benchmarks.figures import (
    ROOT, FigureError, Tag, artifact_value, check, docs, find_tags, formatted, parse_number,
    split_key, update, written_figure)


def all_tags() -> list[Tag]:
    return [t for doc in docs() for t in find_tags(doc)]


def test_docs_tag_figures():
    # The tags are the mechanism; a refactor that silently stops finding them would pass vacuously.
    n = len(all_tags())
    assert n >= 30, f"README.md and docs/*.md tag {n} figures, fewer than 30: did the tag form change?"


def test_every_tagged_figure_matches_its_artifact():
    problems = [p for p in map(check, all_tags()) if p]
    assert not problems, (
        "figures disagree with their artifacts (fix the figure or the tag):\n" + "\n".join(problems))


@pytest.mark.parametrize("text, value, half", [
    ("0.1415", 0.1415, 0.00005),
    ("1,234", 1234, 0.5),
    ("19,600", 19600, 50),        # an integer's trailing zeros are rounding
    ("545", 545, 0.5),
    ("0.10", 0.1, 0.005),         # a decimal's trailing zero is precision
    ("\u22120.0012", -0.0012, 0.00005),
    ("+0.0039", 0.0039, 0.00005),
    ("3e-4", 0.0003, 0.00005),
    ("12.8", 12.8, 0.05),
])
def test_parse_number(text, value, half):
    v, h = parse_number(text)
    assert v == pytest.approx(value) and h == pytest.approx(half)


@pytest.mark.parametrize("before, figure", [
    ("took 545 s", "545"),
    ("a speed-up of 12.8x", "12.8"),
    ("about 19,600 users/s", "19,600"),
    ("NDCG **0.1415**", "0.1415"),
    ("share 38%", "38"),
    ("0.240 \u00b1 0.010", "0.010"),   # the tag belongs to the figure right before it
    ("difference \u22120.0052", "\u22120.0052"),
    ("in 220 ms ", "220"),
    ("step 209 ms per batch", ""),     # a tag after words, not after a figure, is an error
    ("ml-100k", ""),                   # a name ending in digits is not a figure with a unit
])
def test_written_figure(before, figure):
    assert written_figure(before) == figure


def test_split_key_keeps_dots_in_selectors():
    assert split_key("results[lam=0.3,model=nce-autorec].ndcg") == [
        "results", "[lam=0.3,model=nce-autorec]", "ndcg"]
    assert split_key("a.b[0][-1].c") == ["a", "b", "[0]", "[-1]", "c"]
    with pytest.raises(FigureError):
        split_key("a..b")


def test_split_key_keeps_dots_and_brackets_in_quoted_keys():
    assert split_key('results["yahoo-0.25"].new.phases_s.per-user metrics') == [
        "results", '["yahoo-0.25"]', "new", "phases_s", "per-user metrics"]
    assert split_key('a["x.y"]["p[0].q"][1]') == ["a", '["x.y"]', '["p[0].q"]', "[1]"]
    with pytest.raises(FigureError, match="unbalanced quote"):
        split_key('a["x.y].b')
    with pytest.raises(FigureError, match="malformed"):
        split_key('a"x".b')  # quotes outside brackets name nothing


@pytest.fixture
def results(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({
        "seconds": {"total": 545.2},
        "rows": [{"model": "a", "k": 10, "ndcg": 0.14153}, {"model": "b", "k": 10, "ndcg": 0.2},
                 {"model": "b", "k": 20, "ndcg": 0.3}],
        "ratio": 0.57, "name": "x",
        "sizes": {"yahoo-0.25": {"wall_s": 114.8, "p[1]": 3}, "yahoo-0.5": {"wall_s": 230.1}}}))
    (tmp_path / "t.csv").write_text("model,NDCG mean\nnce,0.240473\nae,0.2417\n")
    return tmp_path


def tag(written, file, key):
    return Tag(doc="docs/x.md", line=3, text=f"<!-- {file} {key} -->", written=written,
               file=file, key=key)


def test_check_agrees_at_the_precision_written(results):
    assert check(tag("0.1415", "r.json", "rows[model=a].ndcg"), results) == ""
    assert check(tag("0.14", "r.json", "rows[0].ndcg"), results) == ""
    assert check(tag("545", "r.json", "seconds.total"), results) == ""
    assert check(tag("0.3", "r.json", "rows[model=b,k=20].ndcg"), results) == ""
    assert check(tag("0.240", "t.csv", "[model=nce].NDCG mean"), results) == ""
    assert check(tag("57", "r.json", "ratio *100"), results) == ""
    assert check(tag("57", "r.json", "ratio * 100"), results) == ""
    assert check(tag("0.67", "r.json", "rows[model=b,k=10].ndcg / rows[model=b,k=20].ndcg"), results) == ""
    assert check(tag("1,000", "r.json", "2 / rows[model=b,k=10].ndcg *100"), results) == ""
    # strictly left to right: (0.2 + 0.3) * 10, and a '-' inside a name is not an operator
    assert check(tag("5.0", "r.json", "rows[model=b,k=10].ndcg + rows[k=20].ndcg *10"), results) == ""
    assert check(tag("-0.43", "r.json", "rows[model=a].ndcg - ratio"), results) == ""
    assert "the artifact says 0.57" in check(tag("0.79", "r.json", "ratio"), results)
    assert "written 0.1416" in check(tag("0.1416", "r.json", "rows[model=a].ndcg"), results)
    # a key holding a dot, quoted in brackets: the right one of two such keys
    assert check(tag("114.8", "r.json", 'sizes["yahoo-0.25"].wall_s'), results) == ""
    assert check(tag("230", "r.json", 'sizes["yahoo-0.5"].wall_s'), results) == ""
    assert check(tag("3", "r.json", 'sizes["yahoo-0.25"]["p[1]"]'), results) == ""
    assert check(tag("2.0", "r.json",
                     'sizes["yahoo-0.5"].wall_s / sizes["yahoo-0.25"].wall_s'), results) == ""
    assert "the artifact says 230.1" in check(tag("114.8", "r.json", 'sizes["yahoo-0.5"].wall_s'),
                                              results)


def test_check_names_doc_line_and_tag_for_missing_things(results):
    missing_file = check(tag("1", "nope.json", "a"), results)
    assert missing_file.startswith("docs/x.md:3: <!-- nope.json a -->") and "no file" in missing_file
    assert "no key 'minutes'" in check(tag("1", "r.json", "seconds.minutes"), results)
    assert "matches 2 elements" in check(tag("1", "r.json", "rows[model=b].ndcg"), results)
    assert "no index 5" in check(tag("1", "r.json", "rows[5].ndcg"), results)
    assert "not a number" in check(tag("1", "r.json", "name"), results)
    assert "no figure" in check(tag("", "r.json", "ratio"), results)
    assert "cannot divide" in check(tag("1", "r.json", "ratio / 0"), results)
    # written unquoted, the dot splits the key: the error says how to name it
    unquoted = check(tag("1", "r.json", "sizes.yahoo-0.25.wall_s"), results)
    assert "no key 'yahoo-0'" in unquoted and '["key.with.dots"]' in unquoted
    assert "no key 'yahoo-1'" in check(tag("1", "r.json", 'sizes["yahoo-1"].wall_s'), results)


def test_find_tags_reads_scale_and_position(tmp_path):
    (tmp_path / "README.md").write_text("x\nup 38%<!-- r.json share *100 --> and 0.2 s<!-- r.json t -->\n")
    found = find_tags(tmp_path / "README.md", tmp_path)
    assert [(t.line, t.written, t.key) for t in found] == [(2, "38", "share *100"), (2, "0.2", "t")]
    assert find_tags(ROOT / "README.md")[0].doc == "README.md"


def test_artifact_value_rejects_a_list_where_a_key_is_named(results):
    with pytest.raises(FigureError, match="no key"):
        artifact_value(tag("1", "r.json", "rows.ndcg"), results)


@pytest.mark.parametrize("value, written, out", [
    (0.57, "0.79", "0.57"),
    (21234, "19,600", "21,200"),      # rounded as the written one was, commas kept
    (21534.4, "1,000", "22,000"),     # an integer's trailing zeros are its rounding
    (1534.4, "1,000", "1,500"),       # ... but no fewer than two significant digits
    (67.3, "80", "67"),
    (83.013, "110", "83"),            # ... but no fewer significant digits than written (not 80)
    (399.96, "452", "400"),
    (12.2, "9", "12"),
    (0.14153, "0.1416", "0.1415"),
    (-0.0012, "+0.0039", "\u22120.0012"),
    (0.0012, "\u22120.0039", "0.0012"),
    (-0.5, "-0.25", "-0.50"),
    (0.00001, "+0.0040", "0.0000"),   # no sign on a zero
    (12.84, "12.8", "12.8"),
    (3e-3, "3e-4", None),             # exponent form: by hand
])
def test_formatted_keeps_the_written_precision_and_style(value, written, out):
    assert formatted(value, written) == out


def test_update_rewrites_only_the_disagreeing_figures(results, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# T\n\nRatio 0.79x<!-- r.json ratio --> and 545 s<!-- r.json seconds.total -->"
                   " at 57%<!-- r.json ratio *100 -->;\nnone<!-- r.json name --> here.\n")
    changes = update(doc, results)
    assert changes == ["doc.md:3: 0.79 -> 0.57  (r.json ratio)"]
    assert doc.read_text() == ("# T\n\nRatio 0.57x<!-- r.json ratio --> and 545 s<!-- r.json "
                               "seconds.total --> at 57%<!-- r.json ratio *100 -->;\n"
                               "none<!-- r.json name --> here.\n")
    assert update(doc, results) == []  # agrees now: nothing left to change


def test_update_leaves_a_tag_with_a_missing_key_and_says_so(results, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("x 0.5<!-- r.json nope -->\n")
    assert update(doc, results) == ["doc.md:1: <!-- r.json nope -->: r.json has no key 'nope' "
                                    "(has ['name', 'ratio', 'rows', 'seconds', 'sizes']) (not changed)"]
    assert doc.read_text() == "x 0.5<!-- r.json nope -->\n"
