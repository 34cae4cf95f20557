"""Damaged data and a diverging run end in one line that says what is wrong: the manifest's CRC-32
of each file names a shard damaged in place (its size unchanged), on open, under
``python -m etl.verify`` and when a Ray Data or Spark read of it fails; a loss that becomes NaN
stops training with its message. Every test damages a copy of the session's prepared ml-latest-small,
never the shared fixture."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prepared import schema as S
from prepared.errors import UsageError
from prepared.files import CHECKSUMS, is_data_file
from prepared.reader import open_prepared
from prepared.verify import naming_damaged_files, verify

ROOT = Path(__file__).resolve().parents[2]


def copy_of(prepared: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "p"
    shutil.copytree(prepared, copy)
    return copy


def manifest_of(prepared: Path) -> dict:
    return json.loads((prepared / S.MANIFEST).read_text())


def a_shard(prepared: Path) -> str:
    return sorted(f for f in manifest_of(prepared)["files"] if f.startswith(S.ROWS_DIR + "/"))[0]


def flip(path: Path, offset: int) -> None:
    """Damage one byte in place (the file keeps its size, as with a bad disk or a bad copy)."""
    data = bytearray(path.read_bytes())
    size = len(data)
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def break_footer(path: Path) -> None:
    """Damage the footer's length (the 4 bytes before the closing 'PAR1'): every Parquet reader
    fails on the file, rather than decoding wrong numbers as a flip in a data page may."""
    flip(path, path.stat().st_size - 6)


def crc(path: Path) -> str:
    return f"{zlib.crc32(path.read_bytes()):08x}"


@pytest.mark.spark
def test_the_manifest_records_the_crc32_of_every_data_file(small_prepared):
    m = manifest_of(small_prepared)
    data = sorted(f for f in m["files"] if is_data_file(f))
    assert sorted(m[CHECKSUMS]) == data
    assert {f.split("/")[0] for f in data} == {S.ROWS_DIR, S.ITEMS_DIR, S.USERS_DIR, S.SPLIT_DIR}
    # the shards' from their writers (a CRC of the bytes as written), the rest read back: both
    # must be the plain zlib CRC-32 of the file as it lies on disk
    assert {f: crc(small_prepared / f) for f in data} == m[CHECKSUMS]
    assert {f"{S.ROWS_DIR}/{s['shard']}": s["crc32"] for s in m["layout"]["row_shards"]} == {
        f: v for f, v in m[CHECKSUMS].items() if f.startswith(S.ROWS_DIR + "/")}


@pytest.mark.spark
def test_a_shard_damaged_in_place_is_named_in_one_line(small_prepared, tmp_path):
    copy = copy_of(small_prepared, tmp_path)
    shard = a_shard(copy)
    listed = manifest_of(copy)[CHECKSUMS][shard]
    flip(copy / shard, (copy / shard).stat().st_size // 2)
    corrupt = (rf"^--data {copy}: {shard} is corrupt: its CRC-32 is {crc(copy / shard)}, its "
               rf"manifest says {listed} \(same size: damaged on disk or in a copy\). Copy the "
               r"directory again .* or run the job that writes it again \(with --overwrite\)$")
    with pytest.raises(UsageError, match=corrupt) as e:
        open_prepared(str(copy))
    assert "\n" not in str(e.value)
    with pytest.raises(UsageError, match=corrupt):
        verify(str(copy))
    cli = subprocess.run([sys.executable, "-m", "etl.verify", str(copy)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and cli.stderr.startswith(f"error: --data {copy}: {shard} "
                                                                 "is corrupt: its CRC-32 is ")
    whole = subprocess.run([sys.executable, "-m", "etl.verify", str(small_prepared)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    n = len(manifest_of(small_prepared)[CHECKSUMS])
    assert whole.returncode == 0, whole.stderr
    assert f"intact: {len(manifest_of(small_prepared)['files'])} files" in whole.stdout
    assert f"{n} checked by CRC-32, 0 decoded whole" in whole.stdout


OLD_LIMIT = 8 << 20  # bytes: the largest file whose CRC-32 open_prepared checked before issue 59


def large_shard_flipped_where_it_decodes(prepared: Path, tmp_path: Path) -> tuple[Path, str]:
    """A copy whose first rows shard is over ``OLD_LIMIT`` (an uncompressed column of random
    bytes beside the rows, in the manifest as the ETL would list it), with one byte flipped in
    that column's data: pyarrow still decodes the file, to other values."""
    copy = copy_of(prepared, tmp_path)
    shard = a_shard(copy)
    rows = pq.read_table(copy / shard)
    rng = np.random.default_rng(0)
    pad = pa.array([rng.bytes(OLD_LIMIT // rows.num_rows + 1024) for _ in range(rows.num_rows)])
    pq.write_table(rows.append_column("padding", pad), copy / shard, compression="none",
                   use_dictionary=False)  # the padding's bytes as they are, in one place
    m = manifest_of(copy)
    m["files"][shard], m[CHECKSUMS][shard] = (copy / shard).stat().st_size, crc(copy / shard)
    (copy / S.MANIFEST).write_text(json.dumps(m))
    assert m["files"][shard] > OLD_LIMIT
    before = pq.read_table(copy / shard).column("padding")
    meta = pq.ParquetFile(copy / shard).metadata
    chunk = meta.row_group(meta.num_row_groups - 1).column(rows.num_columns)
    assert chunk.path_in_schema == "padding"
    flip(copy / shard, chunk.data_page_offset + chunk.total_compressed_size // 2)
    after = pq.read_table(copy / shard).column("padding")  # decodes: no error to see it by
    assert after.length() == before.length() and not after.equals(before)
    return copy, shard


@pytest.mark.spark
def test_a_flipped_byte_in_a_large_shard_stops_every_stage_before_it_reads(
        spark, small_prepared, tmp_path, capsys):
    """Training, scoring and evaluation refuse it in one line, whatever the shard's size, before
    any work: no Ray job, model or recommendation file is needed to get there."""
    from evaluation import evaluate, score
    from training import train

    copy, shard = large_shard_flipped_where_it_decodes(small_prepared, tmp_path)
    line = f"error: --data {copy}: {shard} is corrupt: its CRC-32 is {crc(copy / shard)}"
    out = tmp_path / "out"
    for main, argv in (
            (train.main, ["--data", str(copy), "--model", "puresvd", "--runs-dir", str(out)]),
            (score.main, ["--model", str(out / "none.pt"), "--data", str(copy),
                          "--output", str(out / "recs")]),
            (evaluate.main, ["--recs", str(out / "recs"), "--data", str(copy),
                             "--output", str(out / "eval")])):
        assert main(argv) == 2, main.__module__
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error: ")]
        assert len(err) == 1 and err[0].startswith(line), (main.__module__, err)
    assert not out.exists()


@pytest.mark.spark
def test_a_manifest_without_checksums_stays_readable_and_verify_decodes_its_files(
        small_prepared, tmp_path):
    copy = copy_of(small_prepared, tmp_path)
    m = manifest_of(copy)
    del m[CHECKSUMS]  # as written before checksums
    (copy / S.MANIFEST).write_text(json.dumps(m))
    assert open_prepared(str(copy)).n_items == m["counts"]["items"]
    parquet = [f for f in m["files"] if is_data_file(f) and f.endswith(".parquet")]
    assert verify(str(copy)) == {"files": len(m["files"]), "bytes": sum(m["files"].values()),
                                 "crc32": 0, "decoded": len(parquet)}
    shard = a_shard(copy)
    break_footer(copy / shard)
    open_prepared(str(copy))  # sizes only: nothing to tell the damage by
    with pytest.raises(UsageError, match=rf"^--data {copy}: {shard} is damaged: it does not read "
                                         r"as Parquet \(.+\)\. Copy the directory again"):
        verify(str(copy))


@pytest.mark.spark
def test_a_spark_read_of_a_damaged_shard_fails_in_one_line_naming_it(spark, small_prepared,
                                                                     tmp_path):
    copy = copy_of(small_prepared, tmp_path)
    shard = a_shard(copy)
    break_footer(copy / shard)
    with pytest.raises(UsageError, match=rf"^--data {copy}: {shard} is corrupt") as e:
        with naming_damaged_files(str(copy)):
            spark.read.parquet(str(copy / S.ROWS_DIR)).select(S.USER_INDEX).count()
    assert "\n" not in str(e.value) and e.value.__cause__ is not None  # the read failure
    with pytest.raises(RuntimeError, match="^the worker died$"):  # others pass through unchanged
        with naming_damaged_files(str(copy)):
            raise RuntimeError("the worker died")


@pytest.mark.spark
@pytest.mark.ray
@pytest.mark.parametrize("here", [False, True], ids=["ray-data", "driver"])
def test_a_read_of_a_damaged_shard_fails_in_one_line_naming_it(ray_head, small_prepared,
                                                               tmp_path, here):
    """Read by Ray Data's tasks or, for small data, by the driver: the same one line."""
    from training import feed as F

    copy = copy_of(small_prepared, tmp_path)
    shard = a_shard(copy)
    break_footer(copy / shard)
    with pytest.raises(UsageError, match=rf"^--data {copy}: {shard} is corrupt") as e:
        with naming_damaged_files(str(copy)):
            F.valid_dataset(str(copy / S.ROWS_DIR), here=here).materialize()
    assert "\n" not in str(e.value)


@pytest.mark.spark
@pytest.mark.ray
def test_a_nan_loss_stops_the_run_with_its_message(small_prepared, ray_head, mlflow_server,
                                                   tmp_path):
    """One shard's stored R* made NaN (the targets of NCE-AutoRec's loss): the first epoch's
    loss is NaN, and the run stops there with the message that says what to change."""
    from training.config import TrainConfig
    from training.train import TrainingError, run

    copy = copy_of(small_prepared, tmp_path)
    shard = a_shard(copy)
    rows = pq.read_table(copy / shard)
    rstar = rows.column(S.TRAIN_RSTAR).combine_chunks()
    nan = pa.ListArray.from_arrays(rstar.offsets, pa.array(
        np.full(len(rstar.values), np.nan, np.float32)))
    rows = rows.set_column(rows.schema.get_field_index(S.TRAIN_RSTAR), S.TRAIN_RSTAR, nan)
    pq.write_table(rows, copy / shard, compression="zstd")
    m = manifest_of(copy)  # as the ETL would have written it
    m["files"][shard], m[CHECKSUMS][shard] = (copy / shard).stat().st_size, crc(copy / shard)
    (copy / S.MANIFEST).write_text(json.dumps(m))

    cfg = TrainConfig(data=str(copy), model="nce-autorec", width=16, batch_size=256, epochs=3,
                      patience=100, num_workers=1, output=str(tmp_path / "runs"),
                      experiment="tests", run_name="nan")
    with pytest.raises(TrainingError, match=r"^the training loss became NaN or infinite in epoch "
                                            r"1: lower --lr \(now .*\) or raise --lam") as e:
        run(cfg, mlflow_server.url)
    assert "\n" not in str(e.value)
