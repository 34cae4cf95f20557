"""What a model sees: users' rows as sparse torch batches (EmbeddingBag layout).

A batch stays sparse (flat indices + per-user offsets); only the losses densify, one batch at a
time, on the device. ``Batch`` holds every column a model may ask for (``Recommender.needs``);
the ones it does not need are empty tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import torch


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
        """On ``device``. To a GPU through pinned host memory, so the copies are asynchronous
        (non_blocking from pageable memory is a synchronous copy)."""
        device = torch.device(device)
        pin = device.type == "cuda"
        return Batch(**{f.name: (t.pin_memory() if pin and not t.is_pinned() else t)
                        .to(device, non_blocking=True)
                        for f in fields(self) for t in [getattr(self, f.name)]})


def flat(col) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of an Arrow list column (Array or ChunkedArray); flatten() honours
    slices (apache/arrow#37733)."""
    import pyarrow as pa

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


def row_ids(offsets: torch.Tensor, nnz: int) -> torch.Tensor:
    """(nnz,) int64 row of each sparse entry (the last user runs to ``nnz``)."""
    lengths = torch.diff(offsets, append=torch.tensor([nnz], device=offsets.device))
    return torch.repeat_interleave(torch.arange(len(offsets), device=offsets.device), lengths)


def user_slice(items: torch.Tensor, offsets: torch.Tensor, lo: int, hi: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of users ``lo:hi`` of (items, offsets), as (items, offsets) of their own."""
    start = int(offsets[lo]) if lo < len(offsets) else len(items)
    end = int(offsets[hi]) if hi < len(offsets) else len(items)
    return items[start:end], offsets[lo:hi] - start


def to_csr(items: torch.Tensor, offsets: torch.Tensor, n_items: int, values=None):
    """A scipy CSR matrix (B, n_items) float32 of sparse rows (ones, or ``values``)."""
    import scipy.sparse as sp

    items = items.cpu().numpy()
    indptr = np.append(offsets.cpu().numpy(), len(items))
    data = np.ones(len(items), np.float32) if values is None else np.asarray(values, np.float32)
    return sp.csr_matrix((data, items, indptr), shape=(len(indptr) - 1, n_items))
