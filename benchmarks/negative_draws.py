"""What the ETL's negative draws cost: blocked (``prepared.protocol.negative_counts``) against
drawing every user's at once, in one run.

    .venv/bin/python benchmarks/negative_draws.py [--users 400,8192,40000] [--draws 500]

The ETL draws ``--negatives`` items per warm user (500 by default) from item popularity and
stores them aggregated (``neg_items``, ``neg_counts``): at the Yahoo scale 1.88M users x 500 =
940M draws, each a splitmix64 hash, an alias-table lookup and a per-user sort. Two ways, the same
draws bit for bit (checked here):

    whole     every user's bits, slots and sort as (users, draws) arrays at once: the way before
              (the reference), each intermediate streamed through memory
    blocked   users in blocks of about ``DRAW_BLOCK`` draws, each block in cache
              (what ``negative_counts`` does), and the same at other block sizes

Users per call (``--users``): 400 is what one ETL call draws for at the Yahoo shape (an Arrow
batch of 10,000 positives, about 26 a user), 8192 a training batch that resamples its negatives
(``training/feed.py``, NS modes), 40,000 a large call. Popularity: Zipf(1.2) counts over
``--items`` items (a long tail like Yahoo's); the cost does not depend on the values beyond the
sort's runs. One process, one core; the ETL runs one such pass per Spark task, so on 2 cores its
wall time is about half the one-core figure.
Reported: seconds and draws/s of each, the ratio to whole (higher is faster), and what 1.88M
users would take. Results: ``benchmarks/results/negative_draws.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks import report  # noqa: E402
from prepared import protocol  # noqa: E402

YAHOO_USERS = 1_876_280
BLOCKS = (1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 21)


def whole(users: np.ndarray, draws: int, seed: int, table) -> tuple:
    """The reference: ``negative_counts`` as it was before blocking, every user at once."""
    prob, alias = table
    bits = protocol.random_bits(seed, users, draws)
    items = np.sort(protocol.draw_alias(bits, prob, alias).astype(np.int32), axis=1).ravel()
    new = np.ones(items.size, bool)
    new[1:] = items[1:] != items[:-1]
    new[::draws] = True
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, items.size)).astype(np.int32)
    offsets = np.zeros(len(users) + 1, np.int64)
    np.cumsum(np.bincount(starts // draws, minlength=len(users)), out=offsets[1:])
    return offsets, items[starts], counts


def blocked(block: int):
    def fn(users, draws, seed, table):
        saved, protocol.DRAW_BLOCK = protocol.DRAW_BLOCK, block
        try:
            return protocol.negative_counts(users, None, draws, seed, table)
        finally:
            protocol.DRAW_BLOCK = saved
    return fn


def best_of(fn, repeats: int) -> tuple[float, list]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", default="400,8192,40000", help="users per call, comma-separated")
    p.add_argument("--draws", type=int, default=500, help="per user (the ETL's --negatives)")
    p.add_argument("--items", type=int, default=44_865)
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs each")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "negative_draws"))
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    pop = np.minimum(rng.zipf(1.2, args.items), 10**6).astype(np.int64)
    table = protocol.alias_table(pop)
    ways = {"whole": whole, **{f"blocked {b}": blocked(b) for b in BLOCKS}}
    ways["whole"](np.arange(2000), args.draws, 0, table)  # warm-up
    rows = []
    for n_users in (int(u) for u in args.users.split(",")):
        users = np.arange(n_users, dtype=np.int64) * 3 + 11  # sparse indices, as a shard's are
        # repeated so that each way draws at least 20M times: small calls are timed in bulk
        calls = max(1, 20_000_000 // (n_users * args.draws))
        ref = None
        for name, fn in ways.items():
            def run(fn=fn, users=users, calls=calls):
                return [fn(users, args.draws, 0, table) for _ in range(calls)]
            seconds, out = best_of(run, args.repeats)
            out = out[0]
            ref = out if ref is None else ref
            same = all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(ref, out))
            rows.append({"users": n_users, "calls": calls, "way": name,
                         "block": None if name == "whole" else int(name.split()[1]),
                         "seconds": seconds / calls, "same_draws": same})
            print(f"{n_users} users, {name}: {seconds / calls:.4f}s a call, same draws as whole: "
                  f"{same}", flush=True)
            if not same:
                raise SystemExit(f"{name}: draws differ from the reference; a bug in negative_counts")
    write(rows, args)
    return 0


def write(rows: list[dict], args) -> None:
    stamp = {**report.stamp("negative_draws.py"), "draws": args.draws, "items": args.items,
             "default_block": protocol.DRAW_BLOCK}
    lines = ["# Negative draws: blocked against all of a call's users at once\n",
             f"Command: `{stamp['command']}`  ",
             f"Commit: {stamp['commit']}; machine: {stamp['machine']}; {stamp['date']}.  ",
             f"{args.draws} draws per user over {args.items:,} items (Zipf 1.2 popularity), one "
             f"process; seconds per call, best of {args.repeats} (small calls timed in bulk). "
             "Every way gives the same draws bit for bit (checked). x: whole's seconds / this "
             f"way's (higher is faster). Yahoo s: one core's seconds for {YAHOO_USERS:,} users' "
             f"draws at this rate. The default block (`prepared.protocol.DRAW_BLOCK`) is "
             f"{protocol.DRAW_BLOCK:,} draws.\n",
             "| users a call | way | block (draws) | s a call | M draws/s | x | Yahoo s (one core) |",
             "|---|---|---|---|---|---|---|"]
    ref = {}
    for r in rows:
        s = r["seconds"]
        ref.setdefault(r["users"], s)
        rate = r["users"] * args.draws / s
        mark = "**" if r["block"] == protocol.DRAW_BLOCK else ""
        lines.append(f"| {r['users']:,} | {mark}{r['way'].split()[0]}{mark} | "
                     f"{r['block'] or 'all'} | {s:.4f} | {rate / 1e6:.1f} | "
                     f"{ref[r['users']] / s:.2f} | {YAHOO_USERS * args.draws / rate:.0f} |")
    report.publish(Path(args.out), {**stamp, "results": rows}, lines)


if __name__ == "__main__":
    sys.exit(main())
