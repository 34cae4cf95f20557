"""Reference for the ETL benchmark: the least any ETL of this data must do on Spark.

Generates the same synthetic rows as ``prepare.py --dataset synthetic``, shuffles them once by
user and writes them as Parquet: generate + one shuffle + one write, nothing else. The benchmark
reports the ETL's wall time as a ratio to this, measured in the same run on the same machine.

    spark-submit benchmarks/etl_floor.py --users N --items M --positives P --output DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from etl.synthetic import synthetic_rows  # noqa: E402
from runtime.spark import get_spark  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--users", "--items", "--positives", "--partitions"):
        p.add_argument(flag, type=int, required=flag != "--partitions", default=None)
    p.add_argument("--output", required=True)
    args = p.parse_args()
    spark = get_spark("etl-floor")
    t0 = time.perf_counter()
    rows = synthetic_rows(spark, args.users, args.items, args.positives, seed=0)
    parts = args.partitions or max(4, -(-args.positives // 500_000))
    rows.repartition(parts, "user_id").write.mode("overwrite").parquet(args.output)
    print(json.dumps({"floor_s": round(time.perf_counter() - t0, 2)}))


if __name__ == "__main__":
    main()
