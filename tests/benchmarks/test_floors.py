"""benchmarks/floors.py's arithmetic: each stage's work counted by hand on a tiny shape, and the
floor in seconds from given rates (no measuring)."""

import math

import pytest

from benchmarks import floors as F

# 10 users (2 cold), 100 items, 20 positives each; width 4, top 5, 2 workers of 4 users a step
TINY = F.Shape(users=10, items=100, positives=200, width=4, k=5, global_batch=8, workers=2,
               cold_share=0.2, valid_sample=0.5, negatives_per_user=1, heads=2)


def amounts(work: dict) -> dict:
    return {part: w["amount"] for part, w in work.items()}


def test_scoring_work_by_hand():
    w = amounts(F.score_work(TINY))
    assert w["products"] == 2 * 10 * 4 * 100
    assert w["top-k read of the scores"] == 10 * 100 * 4
    assert w["encoder gather"] == pytest.approx(10 * (20 * 0.7) * 4 * 4)  # train+valid inputs
    # id 11 + cold 1 + 2 offsets 8 + 14 item indices x 4
    assert w["read user rows"] == pytest.approx(10 * (11 + 1 + 8 + 14 * 4))
    assert w["write top-k lists"] == 10 * (11 + 8 + 5 * 13)
    # validation: half of the 8 warm users, nothing written
    v = amounts(F.validate_work(TINY))
    assert v["products"] == 2 * 4 * 4 * 100 and "write top-k lists" not in v


def test_training_step_and_epoch_by_hand():
    s = amounts(F.step_work(TINY))
    nd = 100 * 4 * 4  # bytes of one (items, width) matrix
    assert s["Gram W'W"] == s["W (h'h)"] == 2 * 2 * 100 * 4 * 4   # 2 heads x 2 n d^2
    assert s["batch products"] == 2 * 3 * 2 * 4 * 4 * 4            # 2 heads x 3 x 2 b d^2
    nnz = 4 * 20 * 0.5                                             # a worker's batch's train items
    assert s["gathers"] == 5 * nnz * 4 * 4 and s["scatters"] == 3 * nnz * 4 * 4
    assert s["head vectors"] == 2 * 4 * nd
    assert s["encoder grad + L2"] == (1 + 6 * 3) * nd
    assert s["Adam (fused)"] == 7 * 3 * nd and s["DDP all-reduce"] == 2 * 3 * nd
    e = amounts(F.epoch_work(TINY))
    # 8 warm users = 1 global step, taken by both workers
    assert all(e[part] == 2 * s[part] for part in s)
    assert e["read user rows"] == pytest.approx(8 * (4 + 1 + 8 + 2 * 10 * 4))


def test_evaluation_and_etl_work_by_hand():
    ev = amounts(F.evaluate_work(TINY))
    assert ev["join: sort entries and test pairs"] == 10 * 5 + 200 * 0.3
    assert ev["read split table"] == 200 * F.SPLIT_ROW_BYTES
    etl = amounts(F.etl_work(TINY))
    assert etl["shuffle (write + read)"] == 2 * 200 * F.SHUFFLE_ROW_BYTES
    assert etl["write split table"] == etl["read positives"] == 200 * F.SPLIT_ROW_BYTES
    # one draw is one distinct negative: 44 fixed bytes + (10 train + 10 R* + 4 valid + 6 test
    # + 1 item + 1 count) list entries x 4
    assert F.distinct_draws(100, 1) == pytest.approx(1.0)
    assert etl["write user rows"] == pytest.approx(10 * (44 + 4 * (20 * (1 + 0.2 + 0.3) + 2)))


def test_floor_seconds_divides_by_the_rates_and_scales_sorts_by_n_log_n():
    work = {"a": {"kind": "matmul_score", "amount": 6e9},
            "b": {"kind": "bandwidth", "amount": 1e9},
            "c": {"kind": "sort", "amount": 2048}}
    rates = {"matmul_score": 3e9, "bandwidth": 4e9, "sort": 2048.0, "sort_block": 1024}
    got = F.floor_seconds(work, rates)
    assert got["a"] == 2.0 and got["b"] == 0.25
    assert got["c"] == pytest.approx(0.5 * 2048 * 11 / (1024 * 10))  # a block takes 0.5 s
    assert got["total"] == pytest.approx(2.25 + got["c"])
    # a stage's ratio: its seconds over that total, from the floors' rates
    floors = {"rates": {k: 1.0 for k in ("matmul_score", "bandwidth", "gather",
                                          "parquet_read_rows", "parquet_write_rows")}}
    total = sum(w["amount"] for w in F.score_work(TINY).values())
    assert F.stage_floor("score", TINY, floors) == pytest.approx(total)
    assert F.ratio_to_floor("score", 3 * total, TINY, floors) == pytest.approx(3.0)
    assert math.isclose(F.distinct_draws(100, 10**6), 100, rel_tol=1e-6)


def test_yahoo_scale_names_a_kept_stages_other_cpu():
    from benchmarks.yahoo_scale import cpu_note

    here = F.cpu()
    assert cpu_note({"cpu": here}, here) == ""
    # another CPU than this one, whichever host runs the test (the hosts behind one machine change)
    other = "AMD EPYC, 2 cores, AVX2" if "Intel" in here else "Intel(R) Xeon(R) Processor, 2 cores, AVX512"
    assert other != here
    assert cpu_note({"cpu": other}, here) == f" (CPU: {other})"
    assert cpu_note({}, here) == " (CPU: not recorded)"  # a stage from before stages recorded it


def test_scoring_candidates_include_the_fused_kernel_where_it_is_built(monkeypatch):
    """Scoring's floor takes the fastest exact product: the fused kernel is a candidate where
    it is built (AVX-512), and its kernel does the product's work with each row's best kept."""
    from models import stream_topk
    built = stream_topk.fused_here()
    s = F.SHAPES["yahoo"]
    for here in (False, True):
        monkeypatch.setattr(stream_topk, "fused_here", lambda here=here: here)
        kinds = {kind for kind, _ in F.score_candidates(s)}
        assert kinds == ({"matmul", "fused"} if here else {"matmul"})
        assert all(args["layout"] == "fused" for kind, args in F.score_candidates(s)
                   if kind == "fused")
    if built:
        assert F.KERNELS["fused"](64, 8, 5000)() == 2.0 * 64 * 8 * 5000
    # its own column in the report, beside (not over) torch's nn product at the same m
    table = F.candidate_table([{"m": 93, "layout": "nn", "lib": "torch", "rate": 1e9},
                               {"m": 93, "layout": "fused", "lib": "c", "rate": 3e9}])
    assert table[0] == "| m | nn torch | fused c |" and table[2] == "| 93 | 1.0 | 3.0 |"
