"""How Ray Train hands the datasets to the workers (driver side; imported by ``training.train``).

    train   split equally (``streaming_split(equal=True)``, Ray Train's default): every rank runs
            the same number of DDP steps, which the all-reduce needs
    valid   split once, not equally (``equal=False``): each rank reads and scores only its share,
            and every validation user is scored exactly once (an equal split may drop rows);
            the ranks' sums are all-reduced (``training.loop.evaluate``). Before this, every rank
            read every validation row each epoch and kept ``user_index % world == rank``.
"""

from __future__ import annotations

from ray.train import DataConfig

VALID_BLOCKS_PER_RANK = 8  # blocks of the validation rows per rank (an unequal split deals blocks)


class ShardedValidation(DataConfig):
    def __init__(self):
        super().__init__(datasets_to_split=["train"])

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        valid = datasets.get("valid")
        rest = {k: v for k, v in datasets.items() if k != "valid"}
        out = super().configure(rest, world_size, worker_handles, worker_node_ids, **kwargs)
        if valid is not None:
            if valid.name is None:
                valid.set_name("valid")
            # Ray Data reads small Parquet files into very few blocks (two for Yahoo's 98
            # shards) and an unequal split deals out whole blocks, so one rank got 87% of the
            # users (all of them on smaller sets) and validation ran at one rank's speed; equal
            # blocks, several a rank, leave at most one block's imbalance
            valid = valid.repartition(VALID_BLOCKS_PER_RANK * world_size)
            for rank, share in enumerate(valid.streaming_split(
                    world_size, equal=False, locality_hints=worker_node_ids)):
                out[rank]["valid"] = share
        return out
