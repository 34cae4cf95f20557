"""How Ray Train hands the datasets to the workers (driver side; imported by ``training.train``).

    train   split equally (``streaming_split(equal=True)``, Ray Train's default): every rank runs
            the same number of DDP steps, which the all-reduce needs
    valid   split once, not equally (``equal=False``): each rank reads and scores only its share,
            and every validation user is scored exactly once (an equal split may drop rows);
            the ranks' sums are all-reduced (``training.loop.evaluate``). Before this, every rank
            read every validation row each epoch and kept ``user_index % world == rank``.

Datasets the driver materialized (those that fit, ``training.feed.fits_in_object_store``; each
decided on its own) are split once, in place (``MaterializedDataset.split``): a streaming split
starts a coordinator actor per dataset (a Python process, seconds on a small machine before the
first epoch) and runs an executor every epoch to hand out blocks that are already in the object
store.
"""

from __future__ import annotations

from ray.data.dataset import MaterializedDataset
from ray.train import DataConfig

VALID_BLOCKS_PER_RANK = 8  # blocks of the validation rows per rank (an unequal split deals blocks)


class ShardedValidation(DataConfig):
    def __init__(self):
        super().__init__(datasets_to_split=["train"])

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        held = {k: v for k, v in datasets.items() if isinstance(v, MaterializedDataset)}
        out = split_in_memory(held, world_size)
        streamed = {k: v for k, v in datasets.items() if k != "valid" and k not in held}
        if streamed:
            shares = super().configure(streamed, world_size, worker_handles, worker_node_ids,
                                       **kwargs)
            for rank, share in enumerate(shares):
                out[rank].update(share)
        valid = datasets.get("valid")
        if valid is not None and "valid" not in held:
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


def split_in_memory(datasets: dict, world_size: int) -> list[dict]:
    """The same shares as ``configure``'s streaming splits, from materialized datasets: train
    in equal shares (the remainder dropped, as an equal streaming split drops it), valid in
    shares that differ by one row at most, every row in one of them. No locality hints: the
    blocks are small enough to fetch from any node."""
    from ray.util.debug import log_once

    # Ray Data warns that "the Dataset job will hang" whenever a dataset executes while no CPU
    # is free (this runs once the workers hold theirs: at the Yahoo shape every time). Splitting
    # a materialized dataset runs only short block-slicing tasks, which the CPU a run leaves
    # free for reading schedules: marking the one-time warning as given keeps a false alarm
    # out of the run's log.
    if datasets:
        log_once("cpu_warning")
    out = [{} for _ in range(world_size)]
    for name, ds in datasets.items():
        if world_size == 1:
            shares = [ds]
        elif name == "valid":
            n = ds.count()  # a materialized dataset knows its rows without reading them
            shares = ds.split_at_indices([n * r // world_size for r in range(1, world_size)])
        else:
            shares = ds.split(world_size, equal=True)
        for rank, share in enumerate(shares):
            out[rank][name] = share.iterator()
    return out
