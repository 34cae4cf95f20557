"""benchmarks/peak.py's FMA loops compute what their FLOP count claims (checked by hand on a few
iterations), and floors.py's physical floor puts only the products at that peak."""

import numpy as np
import pytest

from benchmarks import floors as F
from benchmarks import peak
from models import native


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path, how = peak.build(str(tmp_path_factory.mktemp("peak")))
    if peak.compiler() is None:  # a machine without cc: said, not measured
        assert path is None and "no C compiler" in how
        return None
    assert path is not None, how
    assert how.endswith("-O2 -march=native -shared -fPIC")
    return peak.load(path)


def test_the_fp32_loop_runs_every_chain_and_lane_the_count_claims(lib):
    if lib is None:
        assert peak.build()[0] is None
        return
    lanes = lib.fma_lanes()
    assert lanes in (4, 8, 16)
    # acc_c = c, then 3 times acc = acc * 0.5 + 1: every lane of chain c ends at the float32
    # value of that recurrence; the sum is over CHAINS x lanes of them
    want = 0.0
    for c in range(peak.CHAINS):
        acc = np.float32(c)
        for _ in range(3):
            acc = np.float32(acc * np.float32(0.5) + np.float32(1.0))
        want += lanes * float(acc)
    assert lib.fma_fp32(3, 0.5, 1.0) == want
    assert peak.flop_per_iteration(lib, "fp32") == peak.CHAINS * 2 * lanes
    run = peak.kernel(peak.build()[0], "fp32", iters=10)
    assert run() == 10 * peak.CHAINS * 2 * lanes


def test_the_bf16_loop_adds_a_pair_of_products_per_lane_and_instruction(lib):
    if lib is None or not lib.has_bf16():  # no AVX512_BF16: the kernel refuses, plainly
        path = peak.build()[0]
        if path:
            with pytest.raises(ValueError, match="no AVX512_BF16"):
                peak.kernel(path, "bf16")
        return
    # 5 iterations of CHAINS instructions; each adds 2 x (1.5 x 2) to each of 16 lanes
    assert lib.dp_bf16(5, 1.5, 2.0) == peak.CHAINS * 16 * 5 * 2 * 3.0
    assert peak.flop_per_iteration(lib, "bf16") == peak.CHAINS * 64


def test_without_a_compiler_the_peak_is_unmeasured_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    path, why = peak.build(str(tmp_path))
    assert path is None and why.startswith("no C compiler (cc, gcc or clang)")
    lines = F.peak_lines({"compiled": why, "fp32": None, "bf16": None}, 2)
    assert lines == [f"Physical peak: not measured ({why})."]


def test_the_physical_floor_puts_the_products_at_the_peak_and_keeps_the_rest():
    rates = {"matmul_score": 50e9, "matmul_gram": 80e9, "bandwidth": 2**30, "sort": 1e8,
             "sort_block": 4}
    assert F.at_peak(rates, 200e9) == {"matmul_score": 200e9, "matmul_gram": 200e9,
                                       "bandwidth": 2**30, "sort": 1e8, "sort_block": 4}
    work = {"products": {"kind": "matmul_score", "amount": 400e9},
            "read": {"kind": "bandwidth", "amount": 3 * 2**30}}
    assert F.floor_seconds(work, rates)["total"] == pytest.approx(8 + 3)
    assert F.floor_seconds(work, F.at_peak(rates, 200e9))["total"] == pytest.approx(2 + 3)


def test_a_floor_is_the_best_exact_kernel_never_the_bf16_one():
    y = F.SHAPES["yahoo"]
    libs = {(args["layout"], args["lib"]) for _, args in F.score_candidates(y)}
    assert ("linear", "numpy") not in libs and ("linear", "torch") in libs
    from models import stream_topk  # and the fused kernel, where it is built (exact: float32)
    assert {lib for _, lib in libs} == {"torch", "numpy"} | ({"c"} if stream_topk.fused_here()
                                                           else set())
    plan = F.rate_plan(2)
    assert [a["lib"] for _, a in plan["matmul_gram@yahoo"]] == ["torch", "numpy"]
    assert plan["bf16_score@yahoo"][1]["lib"] == "torch-bf16"
    # a bf16 rate, however fast, is not among a shape's rates: no work is floored by it
    rates = F.rates_for("yahoo", {"matmul_score@yahoo": 1.0, "bf16_score@yahoo": 9.0,
                                  "bandwidth": 2.0})
    assert "bf16_score" not in rates and rates["matmul_score"] == 1.0
    rows = [{"m": 93, "layout": "nt", "lib": "torch", "rate": 50e9},
            {"m": 93, "layout": "nt", "lib": "numpy", "rate": 70e9},
            {"m": 512, "layout": "linear", "lib": "torch", "rate": 40e9}]
    assert F.candidate_table(rows) == ["| m | linear torch | nt torch | nt numpy |",
                                       "|---|---|---|---|", "| 93 |  | 50.0 | 70.0 |",
                                       "| 512 | 40.0 |  |  |"]
