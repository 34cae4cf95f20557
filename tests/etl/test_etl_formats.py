"""Netflix (both layouts) and Yahoo! Music R1 on synthetic files in their documented formats."""

import numpy as np
import pytest

from tests.etl_helpers import check_prepared, prepare, reference_positives, reference_time_split
from tests.fixtures import random_ratings, write_netflix_combined, write_netflix_training_set, write_yahoo

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def netflix_ratings():
    return random_ratings(n_users=120, n_items=40, per_user=25, seed=11)


def _netflix_reference(df):
    raw = df.assign(order=range(len(df)), rating=df.rating.astype(float), ts=df.ts.astype(float))
    return reference_positives(raw, lambda r: r > 3)


@pytest.mark.parametrize("layout", ["training_set", "combined_data"])
def test_netflix_layouts(spark, tmp_path, netflix_ratings, layout):
    writer = write_netflix_training_set if layout == "training_set" else write_netflix_combined
    root = writer(tmp_path / "netflix", netflix_ratings)
    pos = _netflix_reference(netflix_ratings)
    out = prepare(spark, tmp_path / "out", dataset="netflix", input=(str(root),),
                  cold_users=0.05, negatives=30)
    # day resolution: ties within a day are broken by the movie id as an integer
    check_prepared(out, pos, reference_time_split(pos), cold_fraction=0.05, negatives=30)
    n_movies = netflix_ratings.item.nunique()
    assert out.manifest["counts"]["lines"]["movie"] == n_movies
    assert len(out.manifest["inputs"]) == (n_movies if layout == "training_set" else 2)
    merged = out.split.merge(netflix_ratings.rename(columns={"user": "user_id", "item": "item_id"}),
                             on=["user_id", "item_id"])
    assert (merged.timestamp == merged.ts).all()


def test_yahoo_r1_255_is_not_positive(spark, tmp_path):
    df = random_ratings(n_users=150, n_items=60, per_user=30, seed=5, scale=(0, 101))
    rng = np.random.default_rng(1)
    df.loc[rng.random(len(df)) < 0.1, "rating"] = 255
    write_yahoo(tmp_path / "ydata-ymusic-user-artist-ratings-v1_0.txt", df)  # found by its name
    raw = df.assign(order=range(len(df)), rating=df.rating.astype(float), ts=np.nan)
    pos = reference_positives(raw, lambda r: (r >= 80) & (r <= 100))
    out = prepare(spark, tmp_path / "out", dataset="yahoo", input=(str(tmp_path),), negatives=40)
    check_prepared(out, pos, None, cold_fraction=0.05, negatives=40)
    assert out.manifest["counts"]["rating_255_pairs"] == int((df.rating == 255).sum()) > 0
    assert out.manifest["parameters"]["split"] == "random"
    bad_255 = set(zip(df.user[df.rating == 255], df.item[df.rating == 255]))
    assert not bad_255 & set(zip(out.split.user_id, out.split.item_id))
