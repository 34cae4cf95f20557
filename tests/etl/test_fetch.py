"""etl.fetch: datasets by name, from local file:// mirrors only (nothing real is downloaded).

The real registry is exercised through $NCE_FETCH_MIRROR / ``mirror=``: a mirror folder holds
host/path copies of the publishers' URLs, built here from tiny files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from etl import fetch as F
from etl.config import DATASETS as ETL_DATASETS
from etl.config import ETLConfig
from tests.conftest import need_dataset

ROOT = Path(__file__).resolve().parents[2]
U_DATA = b"196\t242\t3\t881250949\n186\t302\t3\t891717742\n22\t377\t1\t878887116\n"


def files_under(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def put(mirror: Path, url: str, data: bytes) -> Path:
    """``data`` where the mirror serves ``url`` from."""
    path = Path(F.mirrored(url, str(mirror)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def grouplens_mirror(tmp_path: Path, monkeypatch, name: str, members: dict[str, bytes],
                     md5: str | None = None, pinned: str | None = None):
    """A mirror serving ``name``.zip and its .md5 in GroupLens' own ``MD5 (f) = hex`` form
    (``md5``, default the zip's); the registry's pinned md5 becomes ``pinned`` (default: this
    zip's, as if GroupLens had published it)."""
    mirror = tmp_path / "mirror"
    data = zip_bytes(members)
    ds = F.DATASETS[name]
    put(mirror, ds.files[0].url, data)
    put(mirror, ds.files[0].md5_url,
        f"MD5 ({name}.zip) = {md5 or hashlib.md5(data).hexdigest()}\n".encode())
    remote = dataclasses.replace(ds.files[0], md5=pinned or hashlib.md5(data).hexdigest())
    monkeypatch.setitem(F.DATASETS, name, dataclasses.replace(ds, files=(remote,)))
    return f"file://{mirror}"


def one_file(tmp_path: Path, data: bytes, **remote) -> dict[str, F.Dataset]:
    """A registry of one dataset with one plain file at a file:// URL."""
    src = tmp_path / "src" / "ratings.csv"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(data)
    ds = dataclasses.replace(F.DATASETS["goodbooks"], name="toy",
                             files=(F.Remote(f"file://{src}", "ratings.csv", **remote),))
    return {"toy": ds}


# ---------------------------------------------------------------------------------------------
# Checksums published by the publisher
# ---------------------------------------------------------------------------------------------

def test_good_md5_unpacks_ml100k_where_the_etl_reads_it(tmp_path, monkeypatch):
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-100k", {"ml-100k/u.data": U_DATA,
                                                    "ml-100k/README": b"licence\n",
                                                    "ml-100k/u.item": b"not needed\n"})
    out = io.StringIO()
    path = F.fetch("ml-100k", tmp_path / "cache", mirror=mirror, out=out)

    root = tmp_path / "cache" / "ml-100k"
    assert path == root / "ml-100k" / "u.data" and path.read_bytes() == U_DATA
    assert not (root / "ml-100k" / "u.item").exists()  # only what the ETL and the user need
    sums = F.read_sums(root)
    assert set(sums) == {"ml-100k.zip", "ml-100k/u.data", "ml-100k/README"}
    assert sums["ml-100k/u.data"] == hashlib.sha256(U_DATA).hexdigest()
    # the terms came before the download, and no temporary file is left
    log = out.getvalue()
    assert log.index("Terms of use of ml-100k") < log.index("fetching") < log.index("downloaded")
    assert "https://grouplens.org/datasets/movielens/100k/" in log
    assert not [p for p in files_under(root) if ".part-" in p.name]
    # the ETL takes the file or its folder
    from etl.sources import resolve_inputs
    cfg = ETLConfig(dataset="ml-100k", input=(str(path.parent),), output=str(tmp_path / "o"))
    assert resolve_inputs(cfg) == [str(path)]


def test_bad_md5_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-100k", {"ml-100k/u.data": U_DATA}, md5="0" * 32)
    with pytest.raises(F.FetchError) as e:
        F.fetch("ml-100k", tmp_path / "cache", mirror=mirror, out=io.StringIO())
    msg = str(e.value)
    assert "\n" not in msg
    assert "md5" in msg and "0" * 32 in msg and "ml-100k.zip.md5" in msg
    assert files_under(tmp_path / "cache") == []
    assert not (tmp_path / "cache" / "ml-100k").exists()


def test_a_tampered_mirror_serving_a_matching_md5_is_refused_by_the_pin(tmp_path, monkeypatch):
    """The mirror serves another zip and that zip's own md5 beside it: the md5 pinned in the
    code (GroupLens', as published) still refuses it, and nothing is kept."""
    real = zip_bytes({"ml-100k/u.data": U_DATA})
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-100k", {"ml-100k/u.data": U_DATA + U_DATA},
                              pinned=hashlib.md5(real).hexdigest())
    with pytest.raises(F.FetchError, match=r"ml-100k.zip: md5 \w+ differs from "
                                           rf"{hashlib.md5(real).hexdigest()} pinned in "
                                           r"etl/fetch.py"):
        F.fetch("ml-100k", tmp_path / "cache", mirror=mirror, out=io.StringIO())
    assert files_under(tmp_path / "cache") == []


def test_a_member_with_a_pinned_sha256_is_checked_when_unpacked(tmp_path, monkeypatch):
    """ml-latest-small's zip is rebuilt upstream now and then, its ratings.csv is pinned: one
    that differs is refused and not kept; the pin is the sha256 of the real file."""
    ds = F.DATASETS["ml-latest-small"]
    (member, pinned), = ds.members_sha256
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-latest-small",
                              {member: b"userId,movieId,rating,timestamp\n1,1,4.0,964982703\n"})
    with pytest.raises(F.FetchError, match=rf"{member}: sha256 \w+ differs from {pinned} pinned"):
        F.fetch("ml-latest-small", tmp_path / "cache", mirror=mirror, out=io.StringIO())
    assert not (tmp_path / "cache" / "ml-latest-small" / member).exists()
    assert hashlib.sha256(need_dataset("ml-latest-small/ratings.csv").read_bytes()).hexdigest() \
        == pinned


def test_the_pinned_sha256s_are_those_of_the_real_files():
    """Every sha256 pinned for a file of ../shared/datasets is that file's (the copies there are
    byte for byte the publishers', their READMEs say): citeulike-a's and LightGCN++'s gowalla
    train / valid / test, whose test.txt is LightGCN's own."""
    pins = {"citeulike-a/users.dat": F.DATASETS["citeulike-a"].files[0].sha256,
            **{f"gowalla/{r.name}": r.sha256 for r in F.DATASETS["gowalla"].files}}
    assert len(pins) == 4
    for rel, pinned in pins.items():
        assert pinned and hashlib.sha256(need_dataset(rel).read_bytes()).hexdigest() == pinned, rel
    # and every download has a digest in the code (ml-latest-small's: its member's)
    assert all(f.sha256 or f.md5 or f.git_blob or d.members_sha256
               for d in F.DATASETS.values() for f in d.files)


def test_pinned_git_blob_matches_the_real_citeulike_file(tmp_path):
    """The blob id pinned for citeulike-a is the one of the real users.dat (the shared copy)."""
    users = need_dataset("citeulike-a/users.dat")
    mirror = tmp_path / "mirror"
    put(mirror, F.DATASETS["citeulike-a"].files[0].url, users.read_bytes())
    path = F.fetch("citeulike", tmp_path / "cache", mirror=f"file://{mirror}", out=io.StringIO())
    assert path == tmp_path / "cache" / "citeulike-a" / "users.dat"
    assert path.read_bytes() == users.read_bytes()

    put(mirror, F.DATASETS["citeulike-a"].files[0].url, users.read_bytes() + b"\n1 2")
    with pytest.raises(F.FetchError, match="sha256 .* differs from .* pinned in etl/fetch.py"):
        F.fetch("citeulike-a", tmp_path / "cache2", mirror=f"file://{mirror}", out=io.StringIO())
    assert files_under(tmp_path / "cache2") == []


# ---------------------------------------------------------------------------------------------
# No published checksum: sha256 recorded at first download
# ---------------------------------------------------------------------------------------------

def test_first_download_records_sha256_and_a_tampered_cache_is_refused(tmp_path):
    data = b"user_id,book_id,rating\n1,258,5\n2,4081,4\n"
    registry = one_file(tmp_path, data)
    cache = tmp_path / "cache"
    path = F.fetch("toy", cache, registry=registry, out=io.StringIO())
    assert path.read_bytes() == data
    assert (cache / "toy" / "SHA256SUMS").read_text() == (
        f"{hashlib.sha256(data).hexdigest()}  ratings.csv\n")

    # a later use reads the cache only: the source may be gone
    (tmp_path / "src" / "ratings.csv").unlink()
    out = io.StringIO()
    assert F.fetch("toy", cache, registry=registry, out=out) == path
    assert "fetching" not in out.getvalue()

    path.write_bytes(data + b"3,1,1\n")
    with pytest.raises(F.FetchError) as e:
        F.fetch("toy", cache, registry=registry, out=io.StringIO())
    assert "\n" not in str(e.value)
    assert str(path) in str(e.value) and "SHA256SUMS" in str(e.value)
    assert path.read_bytes() == data + b"3,1,1\n"  # refused, not silently replaced


def test_a_tampered_unpacked_file_is_refused(tmp_path, monkeypatch):
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-100k", {"ml-100k/u.data": U_DATA})
    path = F.fetch("ml-100k", tmp_path / "cache", mirror=mirror, out=io.StringIO())
    path.write_bytes(U_DATA[:20])
    with pytest.raises(F.FetchError, match="u.data: sha256"):
        F.fetch("ml-100k", tmp_path / "cache", mirror=mirror, out=io.StringIO())


def test_a_file_placed_by_hand_is_verified_then_used(tmp_path):
    """What the offline message asks for: the file at the cache path, found by the next run."""
    data = b"user_id,book_id,rating\n1,258,5\n"
    registry = one_file(tmp_path, data)
    registry["toy"] = dataclasses.replace(  # offline: the source cannot be reached
        registry["toy"], files=(F.Remote("file:///nonexistent/ratings.csv", "ratings.csv",
                                         git_blob=_git_blob(data)),))
    placed = tmp_path / "cache" / "toy" / "ratings.csv"
    placed.parent.mkdir(parents=True)
    placed.write_bytes(data + b"9,9,9\n")  # not the publisher's file
    with pytest.raises(F.FetchError, match="git blob id .* not the publisher's file"):
        F.fetch("toy", tmp_path / "cache", registry=registry, out=io.StringIO())
    assert "ratings.csv" not in F.read_sums(placed.parent)
    placed.write_bytes(data)
    assert F.fetch("toy", tmp_path / "cache", registry=registry, out=io.StringIO()) == placed
    assert "ratings.csv" in F.read_sums(placed.parent)


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------------------------------------
# Offline, layouts, the command line
# ---------------------------------------------------------------------------------------------

def test_offline_error_names_the_url_and_the_cache_path(tmp_path):
    with pytest.raises(F.FetchError) as e:
        F.fetch("ml-20m", tmp_path / "cache", mirror="file:///nonexistent", out=io.StringIO())
    msg = str(e.value)
    assert "\n" not in msg
    assert "file:///nonexistent/files.grouplens.org/datasets/movielens/ml-20m.zip" in msg
    assert f"put it at {tmp_path / 'cache' / 'ml-20m' / 'ml-20m.zip'}" in msg
    assert files_under(tmp_path / "cache") == []


def test_ml1m_becomes_a_csv_the_etl_reads(tmp_path, monkeypatch):
    dat = b"1::1193::5::978300760\n1::661::3::978302109\n"
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-1m",
                              {"ml-1m/ratings.dat": dat, "ml-1m/README": b"x"})
    path = F.fetch("ml-1m", tmp_path / "cache", mirror=mirror, out=io.StringIO())
    assert path.read_text() == "user,item,rating,timestamp\n1,1193,5,978300760\n1,661,3,978302109\n"
    cfg = ETLConfig(dataset=F.DATASETS["ml-1m"].etl_dataset, input=(str(path),), output="o")
    assert (cfg.user_col, cfg.item_col, cfg.rating_col, cfg.time_col, cfg.delimiter) == (
        "user", "item", "rating", "timestamp", ",")
    assert "ratings.csv" in str(path) and "ml-1m/ratings.csv" in F.read_sums(path.parents[1])


def test_lightgcn_split_lands_as_the_etl_reads_a_given_split(tmp_path):
    train, test = b"0 1 2 3\n1 2 4\n", b"0 4\n1 1\n"
    ds = F.DATASETS["yelp2018"]
    mirror = tmp_path / "mirror"
    put(mirror, ds.files[0].url, train)
    put(mirror, ds.files[1].url, test)
    # the pinned blob ids are the real files'; these tiny ones are checked against their own
    registry = {"yelp2018": dataclasses.replace(ds, files=tuple(
        dataclasses.replace(r, git_blob=_git_blob(d), sha256=hashlib.sha256(d).hexdigest())
        for r, d in zip(ds.files, (train, test))))}
    path = F.fetch("yelp2018", tmp_path / "cache", registry=registry, mirror=f"file://{mirror}",
                   out=io.StringIO())
    assert path == tmp_path / "cache" / "yelp2018"
    from etl.sources import labelled_inputs
    cfg = ETLConfig(dataset=ds.etl_dataset, input=(str(path),), split="given", output="o")
    assert ds.etl_flags == "--split given"
    assert labelled_inputs(cfg) == [(str(path / "test.txt"), "test"), (str(path / "train.txt"), "train")]


def test_gowalla_lands_with_its_validation_split_and_needs_no_flag(tmp_path):
    """``fetch gowalla`` gets LightGCN++'s train / valid / test (the real files' digests are
    pinned; tiny stand-ins are checked against their own) and ``--dataset gowalla`` reads them
    as the given split with no cold users and no flag: the published protocol."""
    files = (b"0 1 2 3\n1 2 4\n", b"0 5\n1 3\n", b"0 4\n1 1\n")
    ds = F.DATASETS["gowalla"]
    assert [r.name for r in ds.files] == ["train.txt", "valid.txt", "test.txt"]
    assert ds.etl_dataset == "gowalla" and ds.etl_flags == ""
    assert all(r.url.startswith(F.LIGHTGCNPP) and r.git_blob and r.sha256 for r in ds.files)
    mirror = tmp_path / "mirror"
    for r, d in zip(ds.files, files):
        put(mirror, r.url, d)
    registry = {"gowalla": dataclasses.replace(ds, files=tuple(
        dataclasses.replace(r, git_blob=_git_blob(d), sha256=hashlib.sha256(d).hexdigest())
        for r, d in zip(ds.files, files)))}
    path = F.fetch("gowalla", tmp_path / "cache", registry=registry, mirror=f"file://{mirror}",
                   out=io.StringIO())
    assert path == tmp_path / "cache" / "gowalla"
    from etl.sources import labelled_inputs
    cfg = ETLConfig(dataset="gowalla", input=(str(path),), output="o")
    assert (cfg.split, cfg.split_mode, cfg.cold_users, cfg.positive_rule) == ("given", "given", 0.0, "all")
    assert labelled_inputs(cfg) == [(str(path / f"{s}.txt"), s) for s in ("test", "train", "valid")]
    assert F.etl_command(ds, path).startswith(f"spark-submit etl/prepare.py --dataset gowalla --input {path}")


def test_netflix_says_where_to_get_it_and_finds_it_once_placed(tmp_path):
    with pytest.raises(F.FetchError) as e:
        F.fetch("netflix", tmp_path / "cache", out=io.StringIO())
    msg = str(e.value)
    assert "no longer published by Netflix" in msg and "kaggle.com" in msg
    assert str(tmp_path / "cache" / "netflix") in msg and "\n" not in msg
    (tmp_path / "cache" / "netflix").mkdir(parents=True)
    (tmp_path / "cache" / "netflix" / "combined_data_1.txt").write_text("1:\n6,3,2005-09-06\n")
    assert F.fetch("netflix", tmp_path / "cache", out=io.StringIO()) == tmp_path / "cache" / "netflix"


def test_registry_matches_the_etl():
    for ds in F.DATASETS.values():
        spec = ETL_DATASETS[ds.etl_dataset]
        if ds.input != "." and spec.default_files:  # a folder holding the file resolves to it
            assert any(Path(ds.input).match(p) for p in spec.default_files), ds.name
        for r in ds.files:
            assert r.url.startswith("https://") and (r.md5_url or r.git_blob or ds.name == "ml-latest-small")
    with pytest.raises(F.UsageError, match="unknown dataset 'ml-2m'.*ml-100k"):
        F.dataset("ml-2m")


def run_cli(*args: str, env: dict[str, str] | None = None,
            pin: tuple[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m etl.fetch ARGS``; ``pin`` (dataset, md5): that dataset's pinned md5 replaced
    first, for a mirror serving a test zip in place of the publisher's."""
    cmd = ["-m", "etl.fetch"] if pin is None else ["-c", (
        "import dataclasses, sys; from etl import fetch as F; "
        f"d = F.DATASETS[{pin[0]!r}]; F.DATASETS[d.name] = dataclasses.replace(d, files=("
        f"dataclasses.replace(d.files[0], md5={pin[1]!r}),)); sys.exit(F.main(sys.argv[1:]))")]
    return subprocess.run([sys.executable, *cmd, *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=60)


def test_help_and_list():
    out = run_cli("--help")
    assert out.returncode == 0
    for text in ("--list", "--cache", "--print-path", "NCE_DATA_CACHE", "NCE_FETCH_MIRROR",
                 "SHA256SUMS", "ml-100k", "ml-1m", "ml-20m", "ml-latest-small", "goodbooks",
                 "citeulike-a", "gowalla", "yelp2018", "amazon-book", "netflix"):
        assert text in out.stdout, text
    listed = run_cli("--list")
    assert listed.returncode == 0 and "--dataset user-items --split given" in listed.stdout


def test_cli_print_path_feeds_the_etl_and_errors_are_one_line(tmp_path, monkeypatch):
    mirror = grouplens_mirror(tmp_path, monkeypatch, "ml-100k", {"ml-100k/u.data": U_DATA})
    pin = ("ml-100k", F.DATASETS["ml-100k"].files[0].md5)  # the test zip's (grouplens_mirror)
    out = run_cli("ml-100k", "--print-path", env={"NCE_FETCH_MIRROR": mirror,
                                                  "NCE_DATA_CACHE": str(tmp_path / "cache")},
                  pin=pin)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{tmp_path / 'cache' / 'ml-100k' / 'ml-100k' / 'u.data'}\n"
    assert "Terms of use of ml-100k" in out.stderr  # the terms go to stderr, the path alone to stdout

    human = run_cli("ml-100k", "--cache", str(tmp_path / "cache"), env={"NCE_FETCH_MIRROR": mirror},
                    pin=pin)
    assert "spark-submit etl/prepare.py --dataset ml-100k --input " in human.stdout

    bad = run_cli("ml-20m", "--cache", str(tmp_path / "c2"), env={"NCE_FETCH_MIRROR": "file:///nonexistent"})
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[-1].startswith("error: cannot download file:///nonexistent/")
