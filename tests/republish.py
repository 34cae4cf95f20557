"""Publish a copy of a prepared output over OUTPUT as etl/prepare.py publishes its own, without
the ETL's Spark work: the same ``runtime.publish.Publisher`` calls in the same order (the lock and
``recover`` in ``check_target``, the hidden staging, ``write_manifest`` with the row shards'
CRC-32s, ``commit``), so that ``NCE_FAILPOINT`` kills it in the same windows, in seconds instead of
a whole ETL run. The copy's manifest says ``parameters.seed`` = SEED, which tells the outputs apart.

    python -m tests.republish SOURCE OUTPUT SEED    (from the project root)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from prepared import schema as S
from prepared.files import CHECKSUMS, FILES
from runtime.logs import setup_logging
from runtime.publish import Publisher
from runtime.spark import get_spark


def republish(spark, source: Path, output: str, seed: int) -> dict:
    """``source``'s files published as ``output``; the order of calls is etl/prepare.py's run()."""
    previous = json.loads((source / S.MANIFEST).read_text())
    publisher = Publisher(spark, output)
    publisher.check_target(overwrite=True)
    with publisher.staging() as tmp:
        # the ETL's writers fill the staging here; the files are the source's, byte for byte
        shutil.copytree(source, tmp, ignore=lambda folder, names: [S.MANIFEST] if
                        Path(folder) == source else [])
        manifest = {k: v for k, v in previous.items() if k not in (FILES, CHECKSUMS)}
        manifest["parameters"] = {**previous["parameters"], "seed": seed}
        # as the ETL: the shards' CRC-32s given (its writers computed them), the rest read back
        shards = {f: crc for f, crc in previous[CHECKSUMS].items() if f.startswith(S.ROWS_DIR + "/")}
        return publisher.write_manifest(manifest, checksums=shards)


def main(argv: list[str]) -> int:
    source, output, seed = argv
    setup_logging()  # the ETL's log lines on stderr ("restored the previous ...")
    republish(get_spark("republish"), Path(source).resolve(), output, int(seed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
