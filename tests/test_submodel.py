"""Partial-training math of seed 004: index sets, extraction, selective averaging (eq. 3.10)."""

import numpy as np
import pytest

from strategies.submodel import (
    ParamSpec,
    extract,
    group_indices,
    node_indices,
    rolling_indices,
    selective_average,
    static_indices,
    window_size,
)


@pytest.mark.parametrize("width, beta, j, expected", [
    (5, 0.6, 0, [0, 1, 2]),
    (5, 0.6, 3, [3, 4, 0]),  # wrap-around
    (5, 0.6, 4, [4, 0, 1]),
    (5, 0.6, 7, [2, 3, 4]),  # start = j mod K
    (8, 0.25, 6, [6, 7]),
    (8, 0.25, 7, [7, 0]),
    (16, 1 / 16, 5, [5]),
    (64, 0.5, 40, list(range(40, 64)) + list(range(0, 8))),
])
def test_rolling_windows_by_hand(width, beta, j, expected):
    assert rolling_indices(width, beta, j).tolist() == expected


def test_window_size_is_floor_of_beta_k():
    assert [window_size(10, b) for b in (1, 0.5, 0.25, 1 / 8, 1 / 16)] == [10, 5, 2, 1, 1]
    assert window_size(64, 1 / 16) == 4 and window_size(48, 0.25) == 12


def test_rolling_visits_every_node_equally_over_k_rounds():
    counts = np.zeros(12, int)
    for j in range(12):
        counts[rolling_indices(12, 0.25, j)] += 1
    assert counts.tolist() == [3] * 12  # exactly m = floor(beta K) visits each in K rounds


def test_static_and_random_schemes():
    assert static_indices(8, 0.25).tolist() == [0, 1]
    assert node_indices("static", 8, 0.25, 99).tolist() == [0, 1]  # independent of the round
    rng = np.random.default_rng(0)
    r = node_indices("random", 20, 0.25, 3, rng)
    assert len(r) == 5 and len(set(r.tolist())) == 5 and r.tolist() == sorted(r.tolist())
    assert node_indices("rolling", 7, 1.0, 5).tolist() == list(range(7))  # full capacity
    with pytest.raises(ValueError):
        node_indices("zigzag", 8, 0.5, 0)


def test_schemes_differ_only_in_the_index_function():
    widths = {"a": 8, "b": 4}
    g = [np.arange(32.0).reshape(8, 4)]
    specs = [ParamSpec(("a", "b"))]
    for scheme in ("rolling", "static", "random"):
        idx = group_indices(widths, scheme, 0.5, 3, np.random.default_rng(1))
        sub = extract(g, specs, idx)[0]
        assert sub.shape == (4, 2)
        np.testing.assert_array_equal(sub, g[0][np.ix_(idx["a"], idx["b"])])


def test_figure_3_1_five_node_example():
    # nodes a..e; the large client holds {a, b, c, d}, the small one {c, d, e}
    g = [np.zeros(5)]
    specs = [ParamSpec(("n",))]
    large = ({"n": np.array([0, 1, 2, 3])}, [np.array([1.0, 1.0, 1.0, 1.0])], 1.0)
    small = ({"n": np.array([2, 3, 4])}, [np.array([3.0, 3.0, 3.0])], 1.0)
    out = selective_average(g, specs, [large, small])[0]
    # a, b: the large client's value; c, d: the mean of both; e: the small client's value
    assert out.tolist() == [1.0, 1.0, 2.0, 2.0, 3.0]


def test_entries_no_client_held_keep_their_value():
    g = [np.full((4, 3), 9.0, np.float32)]
    specs = [ParamSpec(("o", "i"))]
    up = ({"o": np.array([1, 2]), "i": np.array([0, 2])}, [np.zeros((2, 2), np.float32)], 1.0)
    out = selective_average(g, specs, [up])[0]
    expected = np.full((4, 3), 9.0)
    expected[np.ix_([1, 2], [0, 2])] = 0.0
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.float32


def test_one_full_capacity_client_is_the_identity():
    rng = np.random.default_rng(0)
    g = [rng.normal(size=(6, 3, 3, 3)).astype(np.float32), rng.normal(size=6).astype(np.float32),
         rng.normal(size=(10, 6)).astype(np.float32)]
    specs = [ParamSpec(("c1", None, None, None)), ParamSpec(("c1",)),
             ParamSpec((None, "c1"))]
    idx = group_indices({"c1": 6}, "rolling", 1.0, 4)
    sub = extract(g, specs, idx)
    assert all(np.array_equal(a, b) for a, b in zip(sub, g, strict=True))
    trained = [a + 1 for a in sub]
    out = selective_average(g, specs, [(idx, trained, 1.0)])
    assert all(np.allclose(a, b) for a, b in zip(out, trained, strict=True))


def test_input_channels_follow_the_previous_layer_and_classifier_keeps_outputs():
    # conv1 [8, 3, k, k] (all 3 input channels), conv2 [8, 8, k, k], fc [10, 8] (all 10 outputs)
    g = [np.ones((8, 3, 3, 3)), np.ones((8, 8, 3, 3)), np.ones((10, 8))]
    specs = [ParamSpec(("w", None, None, None)), ParamSpec(("w", "w", None, None)),
             ParamSpec((None, "w"))]
    sub = extract(g, specs, group_indices({"w": 8}, "rolling", 0.25, 6))
    assert [a.shape for a in sub] == [(2, 3, 3, 3), (2, 2, 3, 3), (10, 2)]


def test_cohort_sizes_per_scheme():
    from simulations.coverage import cohort_sizes, main, summary

    rolling = cohort_sizes("rolling", 8, 8, 3, levels=[0.25])  # windows of 2, one step a round
    static = cohort_sizes("static", 8, 8, 3, levels=[0.25])
    assert rolling.sum(axis=0).tolist() == [6] * 8  # each node: 2 of 8 rounds x 3 clients
    assert static[:, :2].tolist() == [[3, 3]] * 8 and static[:, 2:].sum() == 0
    assert summary(static) == {"leading": 3.0, "trailing": 0.0, "all": 0.75, "untouched": 0.75}
    assert main(["--width", "16", "--rounds", "4", "--clients", "2"]) == 0


@pytest.mark.parametrize("width, beta, j, expected", [
    (5, 0.6, 0, [0, 1, 2]),
    (5, 0.6, 1, [4, 0, 1]),  # start (-1) mod 5 = 4
    (5, 0.6, 3, [2, 3, 4]),
    (8, 0.25, 7, [1, 2]),
])
def test_backward_rolling_is_the_fedrolex_codes_torch_roll(width, beta, j, expected):
    """The FedRolex code: torch.roll(arange(K), j % K)[:n] (seed 004 section 5.1)."""
    import torch

    got = rolling_indices(width, beta, j, backward=True).tolist()
    n = window_size(width, beta)
    assert got == expected == torch.roll(torch.arange(width), j % width)[:n].tolist()


def test_label_masked_classifier_rows_average_only_over_clients_holding_the_class():
    """The reference's label_split: client A holds classes {0, 1}, B holds {1, 2}; class 0's
    row is A's alone, class 1's the mean, class 2's B's, class 3's (nobody's) unchanged; other
    arrays are averaged as before."""
    g = [np.full((4, 2), 9.0), np.full(4, 9.0), np.zeros(2)]
    specs = [ParamSpec((None, "h")), ParamSpec((None,)), ParamSpec(("h",))]
    idx = {"h": np.array([0, 1])}
    a = (idx, [np.full((4, 2), 1.0), np.full(4, 1.0), np.full(2, 1.0)], 1.0)
    b = (idx, [np.full((4, 2), 3.0), np.full(4, 3.0), np.full(2, 3.0)], 1.0)
    rows = [np.array([True, True, False, False]), np.array([False, True, True, False])]
    w, bias, hidden = selective_average(g, specs, [a, b], rows, frozenset({0, 1}))
    np.testing.assert_array_equal(w[:, 0], [1.0, 2.0, 3.0, 9.0])
    np.testing.assert_array_equal(bias, [1.0, 2.0, 3.0, 9.0])
    np.testing.assert_array_equal(hidden, [2.0, 2.0])  # not a class array: plain mean
    plain = selective_average(g, specs, [a, b])[0]
    np.testing.assert_array_equal(plain[:, 0], [2.0, 2.0, 2.0, 2.0])  # old: diluted rows
