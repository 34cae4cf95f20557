"""The paper's data arithmetic against hand-computed values and statistical properties."""

import math

import numpy as np
import pytest

from prepared import protocol


@pytest.mark.parametrize("n, expected", [
    (1, (1, 0, 0)), (2, (1, 1, 0)), (3, (2, 1, 0)), (4, (2, 1, 1)), (5, (3, 1, 1)),
    (10, (5, 2, 3)), (11, (6, 2, 3)), (20, (10, 4, 6)), (0, (0, 0, 0)),
])
def test_split_sizes_by_hand(n, expected):
    # n_test = floor(0.3 n), n_valid = floor(0.5 n) - floor(0.3 n), n_train = n - floor(0.5 n)
    assert tuple(int(x) for x in protocol.split_sizes(n)) == expected


def test_split_sizes_match_the_authors_float_arithmetic_and_sum_to_n():
    """Every n < 2,000,000 (the README's claim): the authors' int(0.3 * n) is one IEEE double
    product truncated, which numpy's float64 product reproduces bit for bit (checked against
    Python's own on a sample)."""
    n = np.arange(0, 2_000_000)
    train, valid, test = protocol.split_sizes(n)
    assert np.array_equal(train + valid + test, n)
    authors_test = np.trunc(0.3 * n.astype(np.float64)).astype(np.int64)
    authors_half = np.trunc(0.5 * n.astype(np.float64)).astype(np.int64)
    sample = np.random.default_rng(0).choice(n, 20_000, replace=False)
    assert [int(0.3 * int(k)) for k in sample] == authors_test[sample].tolist()
    assert np.array_equal(test, authors_test)
    assert np.array_equal(valid, authors_half - authors_test)
    assert (train >= 1)[1:].all()  # every user with a positive keeps one for training


def test_split_labels_order_oldest_first():
    assert protocol.split_labels(3) == ["train", "train", "valid"]
    assert protocol.split_labels(4) == ["train", "train", "valid", "test"]
    assert protocol.split_labels(4, test_fraction=0.25, holdout_fraction=0.25) == \
        ["train", "train", "train", "test"]


def test_r_star_by_hand():
    # m = 100 users, beta 1: pop 1 -> log 100, pop 100 -> 0, pop 1000 -> clipped at 0
    got = protocol.r_star(np.array([1, 10, 100, 1000]), z=100, beta=1.0)
    np.testing.assert_allclose(got, [math.log(100), math.log(10), 0.0, 0.0])
    # beta 0.5: log 100 - 0.5 log 10000 = 0; log 100 - 0.5 log 4 = log 50
    np.testing.assert_allclose(protocol.r_star(np.array([10_000, 4]), z=100, beta=0.5),
                               [0.0, math.log(50)], atol=1e-12)


def test_r_star_rejects_unobserved_items():
    with pytest.raises(ValueError, match="observed"):
        protocol.r_star(np.array([0, 3]), z=10, beta=1.0)


def test_uniforms_are_a_pure_function_of_seed_user_and_draw():
    a = protocol.uniform01(7, np.array([3, 5, 9]), 4)
    b = protocol.uniform01(7, np.array([9, 3]), 4)
    np.testing.assert_array_equal(a[0], b[1])
    np.testing.assert_array_equal(a[2], b[0])
    assert not np.array_equal(a, protocol.uniform01(8, np.array([3, 5, 9]), 4))
    assert a.min() >= 0 and a.max() < 1


def test_uniforms_are_uniform():
    u = protocol.uniform01(0, np.arange(2000), 500).ravel()
    hist = np.histogram(u, bins=20, range=(0, 1))[0]
    expected = len(u) / 20
    chi2 = ((hist - expected) ** 2 / expected).sum()
    assert chi2 < 43.8  # chi-square, 19 dof, p = 0.001


def test_negative_counts_totals_and_layout():
    pop = np.array([5, 0, 1, 3, 1])
    users = np.array([10, 11, 12])
    off, items, counts = protocol.negative_counts(users, pop, draws=50, seed=1)
    assert off.tolist()[0] == 0 and len(off) == 4
    for u in range(3):
        sl = slice(off[u], off[u + 1])
        assert counts[sl].sum() == 50
        assert np.all(np.diff(items[sl]) > 0)  # ascending, aggregated
    assert 1 not in items.tolist()  # an item with zero popularity is never drawn


def test_negative_counts_follow_popularity():
    rng = np.random.default_rng(0)
    pop = rng.zipf(1.6, 200).clip(1, 5000)
    off, items, counts = protocol.negative_counts(np.arange(3000), pop, draws=200, seed=3)
    drawn = np.bincount(items, weights=counts, minlength=len(pop))
    expected = pop / pop.sum() * drawn.sum()
    big = expected >= 5  # chi-square needs expected counts >= 5; pool the rest
    obs, exp = drawn[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, drawn[~big].sum()), np.append(exp, expected[~big].sum())
    chi2 = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    assert chi2 < dof + 4 * math.sqrt(2 * dof)  # ~4 sigma of a chi-square with dof degrees


def test_negative_counts_do_not_depend_on_batching():
    pop = np.array([4, 1, 7, 2])
    whole = protocol.negative_counts(np.array([1, 2, 3]), pop, 30, seed=5)
    part = protocol.negative_counts(np.array([3]), pop, 30, seed=5)
    np.testing.assert_array_equal(whole[1][whole[0][2]:], part[1])
    np.testing.assert_array_equal(whole[2][whole[0][2]:], part[2])


def _splitmix64_py(x: int) -> int:
    """SplitMix64's next() from state x (Steele, Lea, Flood 2014), in Python integers."""
    z = (x + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


def test_splitmix64_matches_the_reference_generator():
    # SplitMix64 seeded with 0 starts 0xE220A8397B1DCDAF (the published first output)
    assert _splitmix64_py(0) == 0xE220A8397B1DCDAF
    x = np.array([0, 1, 2**63, 2**64 - 1, 123456789], np.uint64)
    got = protocol.splitmix64(x)
    assert [int(v) for v in got] == [_splitmix64_py(int(v)) for v in x]
    assert x.tolist() == [0, 1, 2**63, 2**64 - 1, 123456789]  # the input is left as it was


@pytest.mark.parametrize("block", [1, 7, 60, 1 << 17])
def test_negative_counts_equal_a_draw_by_draw_reference_for_any_block(monkeypatch, block):
    """The blocked draws (``DRAW_BLOCK`` draws at a time) against one draw at a time in Python:
    key = splitmix64(splitmix64(seed ^ golden) ^ user), draw d = splitmix64(key + d), the high 32
    bits pick a slot, the low 32 accept it with the alias table's probability."""
    monkeypatch.setattr(protocol, "DRAW_BLOCK", block)
    pop = np.array([4, 0, 9, 1, 2, 30, 5])
    prob, alias = protocol.alias_table(pop)
    users, draws, seed = np.array([0, 5, 17, 2**31 - 1]), 20, 3
    off, items, counts = protocol.negative_counts(users, pop, draws, seed)
    base = _splitmix64_py(seed ^ 0x9E3779B97F4A7C15)
    for i, u in enumerate(users):
        key = _splitmix64_py(base ^ int(u))
        drawn = {}
        for d in range(draws):
            bits = _splitmix64_py((key + d) % 2**64)
            slot = ((bits >> 32) * len(prob)) >> 32
            item = slot if (bits & 0xFFFFFFFF) / 2**32 < prob[slot] else int(alias[slot])
            drawn[item] = drawn.get(item, 0) + 1
        sl = slice(off[i], off[i + 1])
        assert dict(zip(items[sl].tolist(), counts[sl].tolist())) == drawn
        assert items[sl].tolist() == sorted(drawn)


def test_negative_counts_edge_cases():
    off, items, counts = protocol.negative_counts(np.array([1, 2]), np.array([1, 1]), 0, seed=0)
    assert off.tolist() == [0, 0, 0] and len(items) == 0
    with pytest.raises(ValueError):
        protocol.negative_counts(np.array([1]), np.array([0, 0]), 5, seed=0)


def test_rstar_per_item_zero_for_items_without_training_positives():
    got = protocol.rstar_per_item(np.array([0, 1, 10, 500]), z=100, beta=0.5)
    np.testing.assert_allclose(got, [0.0, math.log(100), math.log(100) - 0.5 * math.log(10),
                                     max(math.log(100) - 0.5 * math.log(500), 0.0)])
