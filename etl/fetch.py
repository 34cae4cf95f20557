r"""Download a public recommender dataset by name, verified, into a cache, in the layout the ETL reads.

    python -m etl.fetch ml-100k
    spark-submit etl/prepare.py --dataset ml-100k \
        --input $(python -m etl.fetch ml-100k --print-path) --output prepared/ml-100k

Every file comes from its publisher's own address: GroupLens (files.grouplens.org) for MovieLens,
the authors' GitHub repositories (raw files at a pinned commit) for Goodbooks-10k, citeulike-a,
LightGCN's yelp2018 / amazon-book and gowalla (with LightGCN++'s validation split). The Netflix
Prize data is no longer published by Netflix: ``netflix`` only says where to get it and where to
put it.

Integrity: a download is checked against digests written in this file, never only against ones
served beside it (a mirror that serves a tampered zip can serve its md5 too): the sha256 where the
file's bytes could be checked when it was pinned (citeulike-a, gowalla's three files, ml-latest-small's
ratings.csv inside the zip), the publisher's md5 of each MovieLens zip (GroupLens', as published
with the zips) and, for GitHub files, the git blob id at the pinned commit (what git itself checks).
GroupLens' served .md5 is checked as well, as an extra. A file with no digest pinned (none is left
in this registry; a registry passed in may have some) has its sha256 recorded at first download.
Either way the sha256 of every file
this module writes (downloads and what is unpacked from them) goes to CACHE/NAME/SHA256SUMS
(``sha256sum -c`` format), and every later use re-checks it: a changed cache file is refused, never
used or silently replaced. Downloads land under a temporary name and are renamed only once
verified, so an interrupted or failed download leaves nothing behind.

The cache is $NCE_DATA_CACHE, else ~/.cache/nce-autorec/datasets (``--cache`` overrides both).
$NCE_FETCH_MIRROR (a URL prefix, e.g. file:///srv/mirror) replaces every publisher's scheme and
host: https://files.grouplens.org/x.zip is read from file:///srv/mirror/files.grouplens.org/x.zip.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import urlparse

from etl.config import DATASETS as ETL_DATASETS
from prepared.errors import UsageError
from runtime.atomic import atomic_output, temporary_sibling, write_text
from runtime.cli import strict_parser

CHUNK = 1 << 20
SUMS = "SHA256SUMS"


class FetchError(UsageError):
    """A download or a cached file cannot be used; the message names the URL or file and the fix."""


@dataclass(frozen=True)
class Remote:
    """One file to download, and the digests it must have: ``sha256``, ``md5`` (the publisher's,
    copied here) and ``git_blob`` (the file's git blob id at the pinned commit of its URL) are
    pinned in this code; ``md5_url`` is the publisher's checksum file, read at download time (an
    extra check: it comes from the same server as the file). None pinned: the sha256 is recorded
    at first download."""

    url: str
    name: str                   # its name in CACHE/NAME
    md5_url: str | None = None
    git_blob: str | None = None
    sha256: str | None = None
    md5: str | None = None


@dataclass(frozen=True)
class Dataset:
    """A dataset the ETL can read once fetched: what to download, unpack, and give to ``--input``."""

    name: str
    etl_dataset: str            # etl/prepare.py --dataset
    input: str                  # what to pass to --input, relative to CACHE/NAME
    size: str                   # approximate download size, for --list
    terms: str                  # one paragraph
    terms_url: str
    files: tuple[Remote, ...] = ()
    extract: tuple[str, ...] = ()   # zip members unpacked as CACHE/NAME/<member>
    members_sha256: tuple[tuple[str, str], ...] = ()  # (member, sha256) pinned, checked on unpacking
    etl_flags: str = ""         # further etl/prepare.py flags the dataset needs
    convert: str | None = None  # "movielens-dat": ratings.dat (a::b::c::d) -> ratings.csv for --dataset csv
    manual: str | None = None   # no public download: where to get it (the cache path is added)


GROUPLENS = "https://files.grouplens.org/datasets/movielens"
LIGHTGCN = "https://raw.githubusercontent.com/kuandeng/LightGCN/b067ec05f16a24e0e1efe63cd82385f0c469af20/Data"
GOODBOOKS = "https://raw.githubusercontent.com/zygmuntz/goodbooks-10k/6dd165b555a7b47b2dd36743a425776e641ff50c"
CITEULIKE = "https://raw.githubusercontent.com/js05212/citeulike-a/91b603922d7f2d3db18071d4798bf78c9c5d1680"
LIGHTGCNPP = "https://raw.githubusercontent.com/geon0325/LightGCNpp/a394f79a7aceb8f485f6bcb549b4865fe83f1d49/data"

_GROUPLENS_OLD = ("GroupLens (University of Minnesota): research use only; do not state or imply "
                  "endorsement; acknowledge the data in publications (cite Harper & Konstan, ACM TiiS "
                  "2015); no redistribution without separate permission; no commercial use without "
                  "permission. The full licence is the README inside the zip.")
_GROUPLENS_NEW = ("GroupLens (University of Minnesota): research use; do not state or imply endorsement; "
                  "acknowledge the data in publications (cite Harper & Konstan, ACM TiiS 2015); "
                  "redistribution, transformed or not, only under these same terms; no commercial "
                  "use without permission. The full licence is the README inside the zip.")
_LIGHTGCN = ("Pre-split by the LightGCN authors (He et al., SIGIR 2020; repository kuandeng/LightGCN, "
             "which states no licence) from {origin}; the original data's terms apply ({origin_url}): "
             "research use, cite both the original data and LightGCN.")


def _movielens(name: str, members: tuple[str, ...], input: str, size: str, terms: str, page: str,
               etl_dataset: str | None = None, md5: str | None = None, **kw) -> Dataset:
    return Dataset(name, etl_dataset or name, input, size, terms, f"https://grouplens.org/datasets/movielens/{page}/",
                   files=(Remote(f"{GROUPLENS}/{name}.zip", f"{name}.zip",
                                 md5_url=f"{GROUPLENS}/{name}.zip.md5", md5=md5),),
                   extract=members, **kw)


def _lightgcn(name: str, size: str, train_blob: str, test_blob: str, origin: str,
              origin_url: str, test_sha256: str | None = None) -> Dataset:
    return Dataset(
        name, "user-items", ".", size, _LIGHTGCN.format(origin=origin, origin_url=origin_url),
        "https://github.com/kuandeng/LightGCN",
        files=(Remote(f"{LIGHTGCN}/{name}/train.txt", "train.txt", git_blob=train_blob),
               Remote(f"{LIGHTGCN}/{name}/test.txt", "test.txt", git_blob=test_blob,
                      sha256=test_sha256)),
        etl_flags="--split given")


DATASETS: dict[str, Dataset] = {d.name: d for d in (
    # the md5s are GroupLens' own, as published beside the zips
    _movielens("ml-100k", ("ml-100k/u.data", "ml-100k/README"), "ml-100k/u.data", "5 MB",
               _GROUPLENS_OLD, "100k", md5="0e33842e24a9c977be4e0107933c0723"),
    # The ETL has no reader for ratings.dat's '::' separator: it is rewritten as a CSV for --dataset csv
    # (whose defaults, '>3' and a time split, are MovieLens' own).
    _movielens("ml-1m", ("ml-1m/ratings.dat", "ml-1m/README"), "ml-1m/ratings.csv", "6 MB",
               _GROUPLENS_OLD, "1m", etl_dataset="csv", convert="movielens-dat",
               md5="c4d9eecfca2ab87c1945afe126590906"),
    _movielens("ml-20m", ("ml-20m/ratings.csv", "ml-20m/README.txt"), "ml-20m/ratings.csv", "190 MB",
               _GROUPLENS_NEW, "20m", md5="cd245b17a1ae2cc31bb14903e1204af3"),
    # "latest" is rebuilt by GroupLens now and then: its zip is not pinned, the September 2018
    # release's ratings.csv is (the copy under ../shared/datasets/ml-latest-small, byte for byte)
    _movielens("ml-latest-small", ("ml-latest-small/ratings.csv", "ml-latest-small/README.txt"),
               "ml-latest-small/ratings.csv", "1 MB", _GROUPLENS_NEW, "latest",
               members_sha256=(("ml-latest-small/ratings.csv",
                                "80da8b3393dae325bbba5a31f291a6ba55d8d4f4396de3c456f2c1635b1b70e8"),)),
    Dataset("goodbooks", "goodbooks", "ratings.csv", "69 MB",
            "Goodbooks-10k by Zygmunt Zając, under Creative Commons Attribution-ShareAlike 4.0: use, "
            "share and adapt with attribution (goodbooks-10k, Zygmunt Zając), derivatives under the "
            "same licence. Book data originate from goodreads.com.",
            "https://github.com/zygmuntz/goodbooks-10k/blob/master/LICENSE",
            files=(Remote(f"{GOODBOOKS}/ratings.csv", "ratings.csv",
                          git_blob="0d245a10acfe3c89b2e4004cdbc805b99771ac5d"),)),
    Dataset("citeulike-a", "citeulike", "users.dat", "1 MB",
            "citeulike-a (Wang, Chen & Li, IJCAI 2013; user data from Wang & Blei, KDD 2011, from "
            "CiteULike's public snapshots). The repository states no licence: treat it as research "
            "data, cite both papers, and do not redistribute it as if it were licensed.",
            "https://github.com/js05212/citeulike-a",
            files=(Remote(f"{CITEULIKE}/users.dat", "users.dat",
                          git_blob="01c329a6df4e883f3282421557543a547eada9de",
                          sha256="53211d82c14ff261e595634d285ed9fbf8049cf81dcb751d924d695b9612a02c"),)),
    # LightGCN's Gowalla as LightGCN++ (Lee et al., RecSys 2024) publishes it: a validation set
    # carved out of LightGCN's train.txt (train + valid = it, 810,128 pairs), test.txt unchanged
    # (the same blob): choices on valid, the final model on train + valid, test read once
    Dataset("gowalla", "gowalla", ".", "6 MB",
            _LIGHTGCN.format(origin="Gowalla check-ins (SNAP)",
                             origin_url="https://snap.stanford.edu/data/loc-gowalla.html")
            + " The validation split is LightGCN++'s (Lee et al., RecSys 2024; repository "
              "geon0325/LightGCNpp, which states no licence either): cite it too.",
            "https://github.com/geon0325/LightGCNpp",
            files=tuple(Remote(f"{LIGHTGCNPP}/gowalla/{name}.txt", f"{name}.txt", git_blob=blob,
                               sha256=sha) for name, blob, sha in (
                ("train", "55340a5eed71a842b63107a089520f486c98d1d4",
                 "d47e01d060624f389956c0b2f89a1ed8c453ea158631cd2b5320c241f3e1a073"),
                ("valid", "9d86bd6e70f7975def76899c66d83d548ba4ab61",
                 "ddc22c1cd9a7d14fd5cd0c98b1473b614f4323038fef74ae0d28cc9c92a08ba2"),
                ("test", "9ed5af4b5d21511f33740b4e22e3852f45671800",
                 "099a2a73924e4b754dc6efd730d764f492321b53c38eb93298850c83acf57be3")))),
    _lightgcn("yelp2018", "10 MB", "cda12361055ba448ae4bd1070f6000c16dea8f22",
              "30dfbc3437b27b74cb2970b435a5ec93ad9f2468", "the Yelp Open Dataset (2018 edition), "
              "whose licence allows non-commercial academic use only", "https://www.yelp.com/dataset"),
    _lightgcn("amazon-book", "19 MB", "6ef55159c5f1fd7f6d86eb9ff290d0cc2854ac99",
              "09e5da4e0bf46c751c4ba0f4375e414fd13512cd", "the Amazon review data (McAuley et al.)",
              "http://jmcauley.ucsd.edu/data/amazon"),
    Dataset("netflix", "netflix", ".", "2 GB (by hand)",
            "Netflix Prize data: research use only; do not state or imply endorsement by Netflix; "
            "acknowledge it in publications; no redistribution without Netflix's permission; no "
            "commercial use. The full licence is the README shipped with the data.",
            "https://www.kaggle.com/datasets/netflix-inc/netflix-prize-data",
            manual="the Netflix Prize data is no longer published by Netflix (netflixprize.com is "
                   "closed) and its licence forbids redistribution, so it cannot be downloaded here; "
                   "a copy (combined_data_1..4.txt) is on Kaggle, published under the account "
                   "netflix-inc, at https://www.kaggle.com/datasets/netflix-inc/netflix-prize-data "
                   "(a Kaggle account is needed)"),
)}
ALIASES = {"goodbooks-10k": "goodbooks", "citeulike": "citeulike-a", "movielens-20m": "ml-20m"}


# ---------------------------------------------------------------------------------------------
# Paths and checksums
# ---------------------------------------------------------------------------------------------

def default_cache() -> Path:
    return Path(os.environ.get("NCE_DATA_CACHE") or "~/.cache/nce-autorec/datasets").expanduser()


def dataset(name: str, registry: dict[str, Dataset] | None = None) -> Dataset:
    """The dataset called ``name`` (or an alias), or a UsageError listing the names."""
    registry = DATASETS if registry is None else registry
    ds = registry.get(ALIASES.get(name, name))
    if ds is None:
        raise UsageError(f"unknown dataset {name!r}; choose one of {', '.join(registry)} "
                         "(python -m etl.fetch --list)")
    return ds


def mirrored(url: str, mirror: str | None) -> str:
    """``url`` read from ``mirror`` (a URL prefix) instead of its host: prefix/host/path."""
    if not mirror:
        return url
    u = urlparse(url)
    return f"{mirror.rstrip('/')}/{u.netloc}{u.path}"


def file_hashes(path: Path) -> dict[str, str]:
    """md5, sha256 and the git blob id (sha1 of ``blob <size>\\0`` + content) of ``path``, one read."""
    md5, sha256, blob = hashlib.md5(), hashlib.sha256(), hashlib.sha1()
    blob.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            for h in (md5, sha256, blob):
                h.update(chunk)
    return {"md5": md5.hexdigest(), "sha256": sha256.hexdigest(), "git_blob": blob.hexdigest()}


def read_sums(root: Path) -> dict[str, str]:
    """CACHE/NAME/SHA256SUMS as {relative path: sha256}."""
    sums = {}
    path = root / SUMS
    if path.exists():
        for line in path.read_text().splitlines():
            digest, _, name = line.partition("  ")
            if name:
                sums[name] = digest
    return sums


def record_sum(root: Path, rel: str, digest: str) -> None:
    """Add or replace ``rel``'s line in SHA256SUMS (rewritten atomically)."""
    sums = read_sums(root)
    sums[rel] = digest
    write_text(root / SUMS, "".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))


def check_recorded(root: Path, rel: str) -> bool:
    """True if ``rel`` is recorded in SHA256SUMS and still matches; FetchError if it was changed."""
    want = read_sums(root).get(rel)
    if want is None:
        return False
    got = file_hashes(root / rel)["sha256"]
    if got != want:
        raise FetchError(
            f"{root / rel}: sha256 {got} differs from {want} recorded in {root / SUMS} when it was "
            f"fetched; the cached file was changed or damaged: delete it (and its line in {SUMS}) "
            f"and run again to fetch it afresh")
    return True


# ---------------------------------------------------------------------------------------------
# Downloading
# ---------------------------------------------------------------------------------------------

def _offline(url: str, err: BaseException, dest: Path) -> FetchError:
    reason = getattr(err, "reason", None) or err
    return FetchError(f"cannot download {url} ({reason}); if this machine is offline, download it "
                      f"elsewhere and put it at {dest}, then run again (it is verified and used)")


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


class Progress:
    """Bytes and rate on ``out``: redrawn in place on a terminal, a line every 10 s otherwise."""

    def __init__(self, out: TextIO, total: int | None) -> None:
        self.out, self.total, self.done = out, total, 0
        self.start = self.last = time.monotonic()
        self.tty = getattr(out, "isatty", lambda: False)()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= (0.5 if self.tty else 10.0):
            self.last = now
            print(("\r" if self.tty else "  ") + self._line(now), end="" if self.tty else "\n",
                  file=self.out, flush=True)

    def _line(self, now: float) -> str:
        of = f" of {_size(self.total)}" if self.total else ""
        return f"{_size(self.done)}{of} at {_size(self.done / max(now - self.start, 1e-6))}/s"

    def finish(self) -> None:
        print(("\r" if self.tty else "  ") + "downloaded " + self._line(time.monotonic()),
              file=self.out, flush=True)


def _download(url: str, tmp: Path, dest: Path, out: TextIO) -> None:
    """``url`` into ``tmp``; any failure removes ``tmp`` and names ``url`` and ``dest``."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            length = r.headers.get("Content-Length")
            progress = Progress(out, int(length) if length and length.isdigit() else None)
            for chunk in iter(lambda: r.read(CHUNK), b""):
                f.write(chunk)
                progress.update(len(chunk))
        progress.finish()
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        raise _offline(url, e, dest) from None
    except BaseException:  # Ctrl-C: nothing half-written stays
        tmp.unlink(missing_ok=True)
        raise


def _published_md5(md5_url: str, dest: Path, offline_ok: bool, out: TextIO) -> str | None:
    """The hex digest in the publisher's .md5 file (``MD5 (f) = hex`` or ``hex  f``); None when the
    publisher has none (HTTP 404) or, for a file placed by hand (``offline_ok``), when unreachable."""
    try:
        with urllib.request.urlopen(md5_url, timeout=60) as r:
            text = r.read(4096).decode("ascii", "replace")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            print(f"  {md5_url}: not published; the file's sha256 is recorded instead", file=out)
            return None
        raise _offline(md5_url, e, dest) from None
    except (urllib.error.URLError, OSError) as e:
        if offline_ok:
            print(f"  warning: {md5_url} unreachable ({getattr(e, 'reason', e)}); {dest} is trusted "
                  f"as placed and its sha256 recorded", file=out)
            return None
        raise _offline(md5_url, e, dest) from None
    digests = [w.lower() for w in text.replace("=", " ").split()
               if len(w) == 32 and all(c in "0123456789abcdefABCDEF" for c in w)]
    if not digests:
        raise FetchError(f"{md5_url}: holds no md5 digest ({text[:80]!r}); the publisher's checksum "
                         f"file changed format: report it, or put a verified copy at {dest}")
    return digests[0]


def _verify(remote: Remote, path: Path, url: str, md5_url: str | None, offline_ok: bool,
            out: TextIO) -> str:
    """Check ``path`` against the publisher's checksum; its sha256. FetchError if it differs.
    ``offline_ok``: ``path`` was placed by hand, so an unreachable .md5 is a warning, not an error."""
    hashes = file_hashes(path)
    checks = [(what, hashes[key], want, f"pinned in etl/fetch.py for {url}")
              for what, key, want in (("sha256", "sha256", remote.sha256),
                                      ("git blob id", "git_blob", remote.git_blob),
                                      ("md5", "md5", remote.md5)) if want]
    if md5_url:
        want = _published_md5(md5_url, path, offline_ok, out)
        if want:
            checks.append(("md5", hashes["md5"], want, f"published at {md5_url}"))
    fix = ("it is not the publisher's file: replace it with a fresh download" if offline_ok else
           "the download is damaged or the file changed upstream; nothing was kept, run again to "
           "retry")
    for what, got, want, where in checks:
        if got != want:
            raise FetchError(f"{url}: {what} {got} differs from {want} {where}; {fix}")
    return hashes["sha256"]


def ensure_file(root: Path, remote: Remote, mirror: str | None, announce, out: TextIO) -> Path:
    """CACHE/NAME/<remote.name>, verified: from the cache when recorded there, else checked and
    recorded (a file placed by hand), else downloaded to a temporary name, verified and renamed."""
    dest = root / remote.name
    url = mirrored(remote.url, mirror)
    md5_url = mirrored(remote.md5_url, mirror) if remote.md5_url else None
    if dest.exists():
        if not check_recorded(root, remote.name):  # placed by hand: verify before first use
            sha = _verify(remote, dest, str(dest), md5_url, True, out)
            record_sum(root, remote.name, sha)
        return dest
    announce()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(temporary_sibling(dest, "part"))  # downloaded, then verified, then renamed
    print(f"fetching {url}", file=out, flush=True)
    _download(url, tmp, dest, out)
    try:
        sha = _verify(remote, tmp, url, md5_url, False, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)
    record_sum(root, remote.name, sha)
    return dest


# ---------------------------------------------------------------------------------------------
# Unpacking into the ETL's layout
# ---------------------------------------------------------------------------------------------

def _write_atomically(root: Path, rel: str, write, sha256: str | None = None,
                      what: str = "") -> None:
    """``write(file)`` into a temporary name beside CACHE/NAME/rel, then rename and record it;
    with ``sha256``, only if the bytes written have that digest (FetchError otherwise)."""
    dest = root / rel
    with atomic_output(dest, "part") as f:
        digest = hashlib.sha256()
        write(_Hashing(f, digest))
        if sha256 and digest.hexdigest() != sha256:
            raise FetchError(f"{what}: sha256 {digest.hexdigest()} differs from {sha256} pinned in "
                             "etl/fetch.py; the archive is not the publisher's release (a "
                             "tampered mirror, or a new release upstream): delete it and run "
                             "again, or report it if the publisher changed the data")
    record_sum(root, rel, file_hashes(dest)["sha256"])


class _Hashing:
    """A writable file that passes every byte on and keeps their sha256."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.f.write(data)


def _ready(root: Path, rel: str) -> bool:
    """``rel`` exists and matches SHA256SUMS (FetchError if changed); False: (re)make it."""
    return (root / rel).exists() and check_recorded(root, rel)


def unpack(root: Path, archive: Path, members: tuple[str, ...],
           pinned: dict[str, str] | None = None) -> None:
    """Members of ``archive`` as CACHE/NAME/<member>; a missing README is not an error. A member
    with a ``pinned`` sha256 that differs is refused, and nothing of it is kept."""
    pinned = pinned or {}
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        for member in members:
            if _ready(root, member):
                continue
            if member not in names:
                if Path(member).name.startswith("README"):
                    continue
                raise FetchError(f"{archive}: holds no {member} (it holds {sorted(names)[:8]}); the "
                                 "archive's layout changed upstream: report it")
            with zf.open(member) as src:
                _write_atomically(root, member, lambda f: _copy(src, f), pinned.get(member),
                                  f"{archive}: {member}")


def _copy(src, dst) -> None:
    for chunk in iter(lambda: src.read(CHUNK), b""):
        dst.write(chunk)


def movielens_dat_to_csv(src: Path, dst_file) -> None:
    """ml-1m's ``UserID::MovieID::Rating::Timestamp`` as a CSV with the header --dataset csv reads
    by default (``user,item,rating,timestamp``); the values are copied unchanged."""
    dst_file.write(b"user,item,rating,timestamp\n")
    with open(src, "rb") as f:
        for n, line in enumerate(f, 1):
            fields = line.rstrip(b"\r\n").split(b"::")
            if fields == [b""]:
                continue
            if len(fields) != 4:
                raise FetchError(f"{src} line {n}: expected 4 fields separated by '::', found "
                                 f"{len(fields)}; delete the file and run again")
            dst_file.write(b",".join(fields) + b"\n")


# ---------------------------------------------------------------------------------------------
# The whole fetch
# ---------------------------------------------------------------------------------------------

def terms(ds: Dataset) -> str:
    return f"Terms of use of {ds.name}: {ds.terms}\n  Terms: {ds.terms_url}"


def _manual(ds: Dataset, root: Path) -> Path:
    spec_files = ETL_DATASETS[ds.etl_dataset].default_files
    if root.is_dir() and any(any(root.glob(p)) for p in spec_files):
        return root / ds.input if ds.input != "." else root
    raise FetchError(f"{ds.name}: {ds.manual}. Unpack its {' or '.join(spec_files)} into {root}, "
                     "then run again")


def fetch(name: str, cache: str | Path | None = None, *, registry: dict[str, Dataset] | None = None,
          mirror: str | None = None, out: TextIO | None = None) -> Path:
    """Fetch ``name`` into ``cache`` (default: ``default_cache()``) if it is not there yet, verify it,
    and return the path to give etl/prepare.py's ``--input``. ``registry`` and ``mirror`` (default:
    $NCE_FETCH_MIRROR) replace the publishers' addresses (tests, private mirrors)."""
    ds = dataset(name, registry)
    out = sys.stderr if out is None else out
    mirror = os.environ.get("NCE_FETCH_MIRROR") if mirror is None else mirror
    root = Path(cache if cache is not None else default_cache()).expanduser().resolve() / ds.name
    if ds.manual:
        return _manual(ds, root)
    announced = []

    def announce() -> None:  # the terms, once, before the first byte is downloaded
        if not announced:
            announced.append(True)
            print(terms(ds), file=out, flush=True)

    existed = root.exists()
    try:
        paths = [ensure_file(root, r, mirror, announce, out) for r in ds.files]
        for archive in paths:
            if zipfile.is_zipfile(archive) and ds.extract:
                unpack(root, archive, ds.extract, dict(ds.members_sha256))
        if ds.convert == "movielens-dat" and not _ready(root, ds.input):
            src = root / next(m for m in ds.extract if m.endswith(".dat"))
            _write_atomically(root, ds.input, lambda f: movielens_dat_to_csv(src, f))
    except BaseException:
        if not existed and root.exists() and not any(root.iterdir()):
            root.rmdir()  # a first fetch that failed leaves no trace
        raise
    return root if ds.input == "." else root / ds.input


def etl_command(ds: Dataset, path: Path) -> str:
    flags = f" {ds.etl_flags}" if ds.etl_flags else ""
    return (f"spark-submit etl/prepare.py --dataset {ds.etl_dataset}{flags} --input {path} "
            f"--output prepared/{ds.name}")


def listing(registry: dict[str, Dataset] | None = None) -> str:
    registry = DATASETS if registry is None else registry
    rows = [f"{'name':16s} {'download':15s} {'etl/prepare.py':35s} source"]
    for ds in registry.values():
        etl = f"--dataset {ds.etl_dataset}" + (f" {ds.etl_flags}" if ds.etl_flags else "")
        source = "by hand: " + ds.terms_url if ds.manual else urlparse(ds.files[0].url).netloc
        rows.append(f"{ds.name:16s} {ds.size:15s} {etl:35s} {source}")
    aliases = ", ".join(f"{a} = {n}" for a, n in ALIASES.items())
    return "\n".join(rows) + f"\naliases: {aliases}"


def build_parser() -> argparse.ArgumentParser:
    p = strict_parser(
        prog="python -m etl.fetch",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1],
        epilog="Datasets:\n" + listing() + "\n\n" + "\n\n".join(__doc__.split("\n\n")[3:]))
    p.add_argument("name", nargs="?", help="dataset to fetch (see --list)")
    p.add_argument("--list", action="store_true", help="list the datasets and exit")
    p.add_argument("--cache", metavar="DIR",
                   help="cache directory (default: $NCE_DATA_CACHE, else ~/.cache/nce-autorec/datasets)")
    p.add_argument("--print-path", action="store_true",
                   help="print only the path for etl/prepare.py --input on stdout (messages, terms "
                        "and progress go to stderr), for $(python -m etl.fetch NAME --print-path)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    if not args.name:
        p.print_usage(sys.stderr)
        print("error: name a dataset to fetch, or --list", file=sys.stderr)
        return 2
    try:
        ds = dataset(args.name)
        path = fetch(ds.name, args.cache)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing half-written was kept", file=sys.stderr)
        return 130
    if args.print_path:
        print(path)
    else:
        print(f"{ds.name}: {path}\nprepare it with:\n  {etl_command(ds, path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
