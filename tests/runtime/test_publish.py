"""Publishing holds where renames are not atomic: the manifest lists every file with its size and
readers verify it; an ETL killed in each window of publishing leaves either the previous output or
the new one readable, and the next run restores what an interrupted overwrite moved aside. One
writer per output at a time: a second is refused while the first holds the lock, a killed one's
lock is taken over, and only the holder removes leftover staging."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prepared import schema as S
from prepared.errors import UsageError
from prepared.files import check_files
from prepared.reader import open_prepared
from runtime.publish import Publisher, WriterLock

ROOT = Path(__file__).resolve().parents[2]


def test_check_files_names_what_is_wrong():
    listed = {"rows/part-0.parquet": 100, "items/part-0.parquet": 20}
    check_files("D", listed, {**listed, "_SUCCESS": 0, ".part-0.parquet.crc": 12})  # hidden: fine
    with pytest.raises(UsageError, match=r"D is incomplete: 1 file\(s\) its manifest lists are "
                                         r"missing \(e.g. rows/part-0.parquet\)"):
        check_files("D", listed, {"items/part-0.parquet": 20})
    with pytest.raises(UsageError, match=r"differ in size \(e.g. rows/part-0.parquet: 60 bytes, "
                                         r"the manifest says 100\).*run the job that writes it again"):
        check_files("D", listed, {**listed, "rows/part-0.parquet": 60})
    with pytest.raises(UsageError, match=r"1 data file\(s\) are not in its manifest \(e.g. rows/x"):
        check_files("D", listed, {**listed, "rows/x.parquet": 5})


@pytest.mark.spark
@pytest.mark.parametrize("damage", ["missing", "truncated", "extra"])
def test_readers_refuse_a_prepared_directory_that_differs_from_its_manifest(small_prepared,
                                                                           tmp_path, damage):
    copy = tmp_path / "p"
    shutil.copytree(small_prepared, copy)
    manifest = json.loads((copy / S.MANIFEST).read_text())
    shard = next(f for f in manifest["files"] if f.startswith(S.ROWS_DIR + "/"))
    open_prepared(str(copy))  # whole: opens
    if damage == "missing":  # e.g. an S3A rename (a copy) caught half-way
        (copy / shard).unlink()
    elif damage == "truncated":
        (copy / shard).write_bytes((copy / shard).read_bytes()[:100])
    else:
        shutil.copy(copy / shard, copy / S.ROWS_DIR / "stray.parquet")
    with pytest.raises(UsageError, match=rf"--data {copy} is incomplete"):
        open_prepared(str(copy))


# the ETL's arguments for every run below: a small synthetic set, replacing --output
ETL_ARGS = ["--dataset", "synthetic", "--users", "300", "--items", "60", "--positives", "3000",
            "--negatives", "20", "--overwrite"]


def etl_killed(out: Path, seed: int, failpoint: str) -> subprocess.CompletedProcess:
    """The real ETL job, etl/prepare.py in its own process, killed at ``failpoint``."""
    return subprocess.run([sys.executable, "etl/prepare.py", *ETL_ARGS, "--seed", str(seed),
                           "--output", str(out)], cwd=ROOT, env=job_env(failpoint),
                          capture_output=True, text=True, timeout=300)


def etl_here(spark, out: Path, seed: int) -> list[str]:
    """The real ETL job (etl/prepare.py's run(), its arguments parsed by its own parser) in this
    process, on the session's Spark; returns its log lines."""
    from etl.prepare import build_parser, config_from_args, run

    args = build_parser().parse_args([*ETL_ARGS, "--seed", str(seed), "--output", str(out)])
    with logged("etl") as lines:
        run(config_from_args(args), spark)
    return lines


def republish(source: Path, out: Path, seed: int, failpoint: str) -> subprocess.CompletedProcess:
    """``source`` published over ``out`` by tests/republish.py in its own process (the ETL's
    Publisher calls in the ETL's order, without its Spark work), killed at ``failpoint``."""
    return subprocess.run([sys.executable, "-m", "tests.republish", str(source), str(out),
                           str(seed)], cwd=ROOT, env=job_env(failpoint), capture_output=True,
                          text=True, timeout=300)


def job_env(failpoint: str) -> dict[str, str]:
    """A job process's environment: one core and a small JVM beside this session's."""
    return {**os.environ, "SPARK_MASTER": "local[1]", "SPARK_DRIVER_MEMORY": "1g",
            "NCE_FAILPOINT": failpoint}


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[str]]:
    """The messages logger ``name`` logs inside the block (whether or not it propagates)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


def seed_of(out: Path) -> int:
    return open_prepared(str(out)).manifest["parameters"]["seed"]


def hidden(out: Path, kind: str) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.{kind}-*"))


@pytest.mark.spark
def test_an_etl_killed_in_each_window_of_publishing_loses_nothing(spark, tmp_path):
    """Each window, each by a real kill (``os._exit`` at a failpoint: no cleanup, the lock left
    behind). Killed while staging: etl/prepare.py itself, in its own process. Killed between the
    renames and after them: tests/republish.py, which publishes a copy of the first output through
    the same Publisher calls as the ETL in the same order (a whole ETL run there would only add a
    minute of Spark stages each). The first output and the run that must restore the previous one
    are the real ETL's run() in this process, so the ETL's own recovery is what is checked."""
    out = tmp_path / "prepared"
    etl_here(spark, out, seed=1)
    assert seed_of(out) == 1
    source = tmp_path / "seed-1"  # what the republishing runs copy (a real prepared output)
    shutil.copytree(out, source)

    # killed while staging (before its manifest): the previous output is untouched
    killed = etl_killed(out, seed=2, failpoint="before-manifest")
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert seed_of(out) == 1
    (left,) = hidden(out, "tmp")

    # killed between the two renames: no output at the path; the previous one is whole aside,
    # and a reader says so
    killed = republish(source, out, seed=3, failpoint="moved-aside")
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert not out.exists()
    assert left not in hidden(out, "tmp")  # this run removed the last one's leftover staging
    (aside,) = hidden(out, "old")
    assert seed_of(aside) == 1
    with pytest.raises(UsageError, match=rf"an overwrite of it was interrupted; the previous output "
                                         rf"is whole in {aside}, and the next etl/prepare.py run"):
        open_prepared(str(out))

    # the next run restores it first, then is killed after publishing, before deleting the old
    killed = republish(source, out, seed=4, failpoint="published")
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert "restored the previous" in killed.stderr and str(aside) in killed.stderr
    assert seed_of(out) == 4 and len(hidden(out, "old")) == 1  # the new output is in place

    # an output caught half-copied (S3A renames copy file by file, manifest possibly first),
    # with the previous one still aside: refused by readers, replaced by the old on the next run
    manifest = json.loads((out / S.MANIFEST).read_text())
    (out / next(f for f in manifest["files"] if f.startswith("rows/"))).unlink()
    with pytest.raises(UsageError, match="is incomplete"):
        open_prepared(str(out))
    lines = etl_here(spark, out, seed=5)
    assert any(line.startswith("restored the previous") for line in lines), lines
    assert seed_of(out) == 5 and not hidden(out, "old") and not hidden(out, "tmp")
    assert not lock_of(out).exists()  # the killed runs' stale lock was taken over, then let go


# -- one writer at a time: the lock beside each output ----------------------------------------

HOLD = ("import sys; from runtime.publish import WriterLock; "
        "WriterLock.local(sys.argv[1], sys.argv[2]).acquire(); print('held', flush=True); "
        "sys.stdin.read()")


def lock_of(target: Path) -> Path:
    return target.parent / f".{target.name}.lock"


def hold_lock(target: Path) -> subprocess.Popen:
    """Another writer of ``target``: a process holding its lock through the real lock code (a
    job's lock without its Spark work); it lets go when its stdin closes, or dies on kill()."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_of(target)), str(target)],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def publisher(spark, out: Path, backend: str) -> Publisher:
    """A Publisher of ``out``; ``hadoop``: its lock through Hadoop's FileSystem (create without
    overwrite), as on HDFS or S3A, instead of O_EXCL on the local disk."""
    p = Publisher(spark, str(out))
    if backend == "hadoop":
        p._local = None
        p._lock = p._writer_lock()
    return p


@pytest.mark.spark
@pytest.mark.parametrize("backend", ["local", "hadoop"])
def test_a_second_writer_is_refused_and_its_recovery_leaves_the_first_ones_staging(
        spark, tmp_path, backend):
    out = tmp_path / "out"
    staging = tmp_path / ".out.tmp-0123456789ab"  # the first writer's, in use
    staging.mkdir()
    (staging / "part-0.parquet").write_bytes(b"rows")
    first = hold_lock(out)
    try:
        second = publisher(spark, out, backend)
        held = (rf"^{out} is being written by another job: pid {first.pid} on host "
                rf"{socket.gethostname()}, since .* \(lock {lock_of(out)}\); wait for it to "
                r"finish, or, if that job no longer runs, delete the lock and run again$")
        with pytest.raises(UsageError, match=held):
            second.check_target(overwrite=True)
        with pytest.raises(UsageError, match=held):  # only the lock holder recovers
            second.recover()
        assert (staging / "part-0.parquet").read_bytes() == b"rows"
        assert json.loads(lock_of(out).read_text())["pid"] == first.pid
    finally:
        first.stdin.close()
        first.wait(timeout=30)
    assert first.returncode == 0 and not lock_of(out).exists()  # let go at its exit
    # the path is free: the next writer takes the lock, and the staging is now a leftover
    third = publisher(spark, out, backend)
    third.check_target(overwrite=False)
    assert not staging.exists()
    assert json.loads(lock_of(out).read_text())["pid"] == os.getpid()
    third.unlock()
    assert not lock_of(out).exists()


@pytest.mark.spark
@pytest.mark.parametrize("backend", ["local", "hadoop"])
def test_a_stale_lock_is_taken_over_and_said_in_the_log(spark, tmp_path, backend):
    import logging

    out = tmp_path / "out"
    killed = hold_lock(out)
    killed.kill()  # as a killed job: no exit handlers, its lock stays behind
    killed.wait(timeout=30)
    assert json.loads(lock_of(out).read_text())["pid"] == killed.pid
    logger = logging.getLogger("etl")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    try:
        p = publisher(spark, out, backend)
        p.check_target(overwrite=False)
        assert json.loads(lock_of(out).read_text())["pid"] == os.getpid()
        with p.staging() as tmp:
            p.write_text(f"{tmp}/part-0.txt", "new")
            p.write_manifest({})
    finally:
        logger.removeHandler(handler)
    assert any(f"taking over the stale lock {lock_of(out)}: its writer, pid {killed.pid} on "
               f"{socket.gethostname()}" in line and "no longer runs" in line for line in lines)
    assert (out / "part-0.txt").read_text() == "new" and not lock_of(out).exists()


def _race_for_the_lock(lock: str, target: str, start, said: str, others: list[str]) -> None:
    """One writer process of the race below: take the lock and write whether it held it to the
    file ``said``; a holder keeps it until the ``others`` have said theirs (a holder never lets
    go while the others try)."""
    start.wait()
    try:
        WriterLock.local(lock, target).acquire()
        deadline = time.monotonic() + 30
        while not all(os.path.exists(o) for o in others) and time.monotonic() < deadline:
            time.sleep(0.002)
        outcome = "held"
    except UsageError:
        outcome = "refused"
    Path(said).write_text(outcome)
    os._exit(0)  # no exit handlers: a holder's lock is left as a killed job's


def test_three_writers_racing_for_one_stale_lock_never_both_hold_it(tmp_path):
    """A stale lock (its writer's pid no longer runs) and 3 writers started at once, 100 times:
    exactly one holds it each time. Before the takeover lock, two held it in 19 of 100."""
    import multiprocessing

    dead = subprocess.Popen(["true"])
    dead.wait()
    ctx = multiprocessing.get_context("fork")
    for trial in range(100):
        lock = str(tmp_path / f".out{trial}.lock")
        with open(lock, "w") as f:
            json.dump({"pid": dead.pid, "host": socket.gethostname(), "token": "old",
                       "started": "then"}, f)
        start = ctx.Barrier(3)
        said = [tmp_path / f"said-{trial}-{i}" for i in range(3)]
        procs = [ctx.Process(target=_race_for_the_lock,
                             args=(lock, str(tmp_path / "out"), start, str(s),
                                   [str(o) for o in said if o != s])) for s in said]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = sorted(s.read_text() for s in said)
        assert outcomes == ["held", "refused", "refused"], (trial, outcomes)
        assert not os.path.exists(lock + ".takeover")


def test_a_lock_from_another_host_or_without_a_holder_is_refused(tmp_path):
    """Whether a pid runs on another host cannot be told from here: refused, with the way out."""
    lock = tmp_path / ".out.lock"
    lock.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "then"}))
    with pytest.raises(UsageError, match=r"pid 1 on host elsewhere, since then"):
        WriterLock.local(str(lock), str(tmp_path / "out")).acquire()
    lock.write_text("")  # its writer died between creating and filling it
    with pytest.raises(UsageError, match=rf"locked by {lock}, which names no holder .* delete "):
        WriterLock.local(str(lock), str(tmp_path / "out")).acquire()
    assert lock.exists()


def test_a_second_etl_is_refused_before_spark_starts(tmp_path, monkeypatch):
    """The ETL takes its output's lock first, without a JVM: a second writer learns at once
    (it used to start Spark first, 73 s on this machine), and lets go of nothing it did not take."""
    from etl import prepare
    from runtime import spark as runtime_spark

    out = tmp_path / "prepared"
    first = hold_lock(out)
    try:
        def no_spark(*a, **kw):
            raise AssertionError("Spark started before the lock was checked")
        monkeypatch.setattr(runtime_spark, "get_spark", no_spark)
        args = prepare.build_parser().parse_args([
            "--dataset", "ml-latest-small", "--input", str(ROOT / "data" / "ml-latest-small"),
            "--output", str(out)])
        t0 = time.perf_counter()
        with pytest.raises(UsageError, match=rf"{out} is being written by another job: pid "
                                             rf"{first.pid} on host {socket.gethostname()}"):
            prepare.run(prepare.config_from_args(args))
        assert time.perf_counter() - t0 < 5
        assert json.loads(lock_of(out).read_text())["pid"] == first.pid  # still the first's
    finally:
        first.stdin.close()
        first.wait(30)
    assert not lock_of(out).exists() and not out.exists()
