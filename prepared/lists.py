"""Arrow list columns (the prepared rows' ``train_items``, ``neg_items``, ..., and the lists the
stages write: the ETL's per-user positives, scoring's top-K) built from flat values and per-row
lengths: ``pa.ListArray.from_arrays(list_offsets(lengths), values)``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def list_offsets(lengths: np.ndarray) -> pa.Array:
    """Arrow list offsets (int32) of lists of these lengths."""
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out, pa.int32())
