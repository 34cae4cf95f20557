"""benchmarks/projection.py's arithmetic on made-up measurements whose answers are worked by hand
(no pipeline runs)."""

import pytest

from benchmarks import projection as P
from benchmarks.yahoo_scale import YAHOO

N = YAHOO["positives"]


def made_up(fraction: float, etl=(30, 200), epoch=(10, 100), score=(5, 300), evaluate=(20, 40),
            startup=40.0, epochs=1) -> dict:
    """A yahoo_scale.json at ``fraction`` whose stages take fixed + per_full_scale * fraction s."""
    sec = {k: a + b * fraction for k, (a, b) in
           {"etl": etl, "epoch": epoch, "score": score, "evaluate": evaluate}.items()}
    stage = lambda s: {"wall_s": s, "peak_over_start_gib": 1.0}
    return {"commit": "abc", "date": "2026-11-28", "stages": {
        "etl": stage(sec["etl"]), "score": stage(sec["score"]),
        "evaluate": stage(sec["evaluate"]),
        "train": {**stage(startup + epochs * sec["epoch"]),
                  "epochs": [{"epoch_seconds": sec["epoch"]}] * epochs}}}


def test_a_straight_line_is_recovered_and_projected_by_hand():
    points = [P.point(made_up(0.25), 0.25, None), P.point(made_up(0.5), 0.5, None),
              P.point(made_up(1.0, epochs=3), 1.0, None)]
    assert points[2]["seconds"]["train_startup"] == pytest.approx(40.0)
    proj = P.project(points, 10)
    etl = proj["stages"]["etl"]
    assert etl["fixed"] == pytest.approx(30) and etl["slope"] * N == pytest.approx(200)
    assert etl["max_rel_residual"] == pytest.approx(0, abs=1e-6)  # positives are rounded
    assert etl["seconds_projected"] == pytest.approx(30 + 2000)
    # 10x in the full scale's 230 s: 2000 s of variable work over 200 s spare -> 10 nodes
    assert etl["nodes_for_full_scale_time"] == 10
    # score: 3000 / (305 - 5) = 10 nodes; evaluate: 400 / (60 - 20) = 10 nodes
    assert proj["stages"]["score"]["nodes_for_full_scale_time"] == 10
    pl = proj["pipeline"]
    fixed = 40 + 30 + 3 * 10 + 5 + 20
    variable = 2000 + 3 * 1000 + 3000 + 400
    assert pl["fixed_s"] == pytest.approx(fixed) and pl["one_node_s"] == pytest.approx(fixed + variable)
    assert pl["nodes_for_15_min"] == -(-variable // (900 - fixed))  # ceil: 8400 / 775 -> 11


def test_a_bent_line_shows_in_the_residual():
    points = [P.point(made_up(0.25), 0.25, None), P.point(made_up(0.5, etl=(30, 400)), 0.5, None),
              P.point(made_up(1.0), 1.0, None)]
    assert P.project(points, 10)["stages"]["etl"]["max_rel_residual"] > 0.05
