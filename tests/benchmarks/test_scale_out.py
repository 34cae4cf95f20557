"""benchmarks/scale_out.py's step model, against values worked by hand."""

from __future__ import annotations

import pytest

from benchmarks import scale_out as so

# F 1 s, u 1 ms a user, S 1 GB, no software floor; an 8 Gb/s network sends 1 GB a second
C = {"fixed_s": 1.0, "per_user_s": 1e-3, "allreduce_bytes": 1e9, "loopback_s_per_byte": 0.0}


def test_a_ring_sends_two_n_minus_one_over_n_of_the_bytes_and_never_beats_the_floor():
    assert so.ring_seconds(1e9, 1, 8, 0.0) == 0.0  # one node: nothing to send
    assert so.ring_seconds(1e9, 2, 8, 0.0) == pytest.approx(1.0)  # 2 * 1/2 * 1 GB at 1 GB/s
    assert so.ring_seconds(1e9, 4, 8, 0.0) == pytest.approx(1.5)
    assert so.ring_seconds(1e9, 2, 8, 3.0) == 3.0


def test_data_parallel_pays_the_fixed_work_and_the_all_reduce_on_every_rank():
    """16,384 users, global batch 8192 on 2 nodes: 2 steps of 1 + 4096 x 1 ms + 1 s (the
    all-reduce) = 6.096 s; one node takes 2 x (1 + 8.192) = 18.384 s, so the efficiency is
    18.384 / (2 x 12.192)."""
    r = so.design_epoch("dp", 16_384, 2, C, 8)
    assert r["global_batch"] == 8192 and r["step_s"] == pytest.approx(6.096)
    assert r["epoch_s"] == pytest.approx(12.192)
    assert r["efficiency"] == pytest.approx(18.384 / (2 * 12.192))


def test_a_growing_batch_and_bf16_gradients():
    """Per-worker batch 8192 on 2 nodes: one step of 16,384 users, 1 + 8.192 + 1 s; in bf16 the
    all-reduce halves to 0.5 s."""
    assert so.design_epoch("dp-large", 16_384, 2, C, 8)["epoch_s"] == pytest.approx(10.192)
    assert so.design_epoch("dp-large-bf16", 16_384, 2, C, 8)["epoch_s"] == pytest.approx(9.692)


def test_item_sharding_divides_the_step_and_all_reduces_only_the_codes():
    """2 nodes: (1 + 8.192) / 2 per step plus the codes' all-reduce, 2 x 8192 x 200 x 4 bytes
    = 13,107,200 over the ring: 13.1072 ms at 1 GB/s."""
    r = so.design_epoch("item-sharded", 16_384, 2, C, 8)
    assert r["step_s"] == pytest.approx(9.192 / 2 + 0.0131072)
    assert r["epoch_s"] == pytest.approx(2 * (9.192 / 2 + 0.0131072))


def test_the_limits_as_the_nodes_grow():
    """Data parallelism at a fixed batch keeps F and a full ring (2 S at 1 GB/s) per step; item
    sharding keeps only the codes' ring; a growing batch has none."""
    assert so.floor_epoch("dp", 16_384, C, 8) == pytest.approx(2 * (1 + 2.0), rel=1e-5)
    assert so.floor_epoch("item-sharded", 16_384, C, 8) == pytest.approx(2 * 0.0262144, rel=1e-5)
    assert so.floor_epoch("dp-large", 16_384, C, 8) == 0.0


def test_the_step_line_through_the_batches():
    F, u, resid = so.fit_step([1024, 2048, 4096], [1.0 + 1024e-4, 1.0 + 2048e-4, 1.0 + 4096e-4])
    assert (F, u) == (pytest.approx(1.0), pytest.approx(1e-4)) and resid < 1e-9
