"""User rows (the ETL's ``rows/`` shards) as sparse torch batches.

A batch stays sparse (EmbeddingBag layout: flat indices + per-user offsets); only the losses
densify, one batch at a time, on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import torch

from etl import schema as S


@dataclass
class Batch:
    """One batch of users. Index tensors int64, values float32; ``*_offsets`` (B,) int64."""

    users: torch.Tensor
    train_items: torch.Tensor
    train_offsets: torch.Tensor
    train_rstar: torch.Tensor
    neg_items: torch.Tensor
    neg_counts: torch.Tensor
    neg_offsets: torch.Tensor

    def __len__(self) -> int:
        return len(self.users)

    def to(self, device: torch.device) -> Batch:
        return Batch(**{f.name: getattr(self, f.name).to(device, non_blocking=True)
                        for f in fields(self)})


def with_rstar(batch: Batch, rstar_item: torch.Tensor) -> Batch:
    """``batch`` with R* gathered from a per-item table (``etl.protocol.rstar_per_item``), for a
    beta other than the ETL's: R* depends on the item alone, so no ETL rerun is needed."""
    return Batch(**{**{f.name: getattr(batch, f.name) for f in fields(batch)},
                    "train_rstar": rstar_item[batch.train_items].to(torch.float32)})


def _flat(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a list column; flatten() honours slices (apache/arrow#37733)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    values = col.flatten().to_numpy(zero_copy_only=False)
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return values, offsets


def sparse_rows(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(items, offsets), int64, in EmbeddingBag layout, from a sequence of per-user item lists."""
    lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
    flat = np.concatenate([np.asarray(r, np.int64) for r in rows]) if len(rows) else np.zeros(0, np.int64)
    offsets = np.zeros(len(rows), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return torch.from_numpy(flat), torch.from_numpy(offsets)


def batch_from_arrow(rows: pa.Table | pa.RecordBatch) -> Batch:
    """A Batch from user rows with the columns of ``etl.schema.ROW_COLUMNS``."""
    train, train_off = _flat(rows.column(S.TRAIN_ITEMS))
    rstar, _ = _flat(rows.column(S.TRAIN_RSTAR))
    neg, neg_off = _flat(rows.column(S.NEG_ITEMS))
    counts, _ = _flat(rows.column(S.NEG_COUNTS))
    t = lambda a, dt: torch.from_numpy(np.array(a, dtype=dt))  # a copy: Arrow buffers are read-only
    return Batch(users=t(rows.column(S.USER_INDEX).to_numpy(zero_copy_only=False), np.int64),
                 train_items=t(train, np.int64), train_offsets=t(train_off, np.int64),
                 train_rstar=t(rstar, np.float32), neg_items=t(neg, np.int64),
                 neg_counts=t(counts, np.int64), neg_offsets=t(neg_off, np.int64))
