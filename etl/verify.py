"""Check every file of a prepared directory: ``python -m etl.verify DIR``.

The checks every stage makes when it opens its data (the manifest, the file list and sizes, the
CRC-32 of every file), as a command: for a copy just made, or a disk in doubt. A shard damaged in
place keeps its size and often still decodes, to wrong numbers (a flipped byte in an
incompressible page is not noticed by Parquet or zstd), so the checksum is the check that counts.
A manifest written before checksums has none; then every Parquet file is decoded whole instead,
which catches only the damage that breaks decoding.

Exit status 0 when every file is intact, 2 with a one-line ``error: ...`` naming the first damaged
file otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time

from prepared.errors import UsageError
from prepared.verify import verify
from runtime.cli import strict_parser


def main(argv: list[str] | None = None) -> int:
    p = strict_parser(prog="python -m etl.verify", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 1)[1],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", metavar="DIR", help="a prepared directory (the ETL's --output): a local "
                   "path or a URI pyarrow reads (hdfs://, s3a://)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        done = verify(args.data)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.data}: intact: {done['files']} files, {done['bytes'] / 2**20:,.1f} MiB; "
          f"{done['crc32']} checked by CRC-32, {done['decoded']} decoded whole (no checksum in "
          f"its manifest) in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
