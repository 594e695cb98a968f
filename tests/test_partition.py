import numpy as np
import pytest

from fedapps.config import ConfigError
from fedapps.data.partition import (
    class_counts,
    emd,
    partition_indices,
    split_train_test,
)

LABELS = np.repeat(np.arange(10), 100)  # 1,000 samples, 100 per class


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_partition_covers_pool_disjointly(scheme):
    parts = partition_indices(LABELS, 10, scheme, seed=3, alpha=0.5, labels_per_client=2)
    joined = np.concatenate(parts)
    assert len(parts) == 10
    assert len(np.unique(joined)) == len(joined)  # disjoint
    if scheme != "shards":  # shards may leave no sample out either, but need not
        assert sorted(joined.tolist()) == list(range(len(LABELS)))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shards"])
def test_partition_is_deterministic_per_seed(scheme):
    a = partition_indices(LABELS, 8, scheme, seed=1, alpha=0.3)
    b = partition_indices(LABELS, 8, scheme, seed=1, alpha=0.3)
    c = partition_indices(LABELS, 8, scheme, seed=2, alpha=0.3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_sizes_and_mixed_labels():
    parts = partition_indices(LABELS, 10, "iid", seed=0)
    assert [len(p) for p in parts] == [100] * 10
    assert all(len(np.unique(LABELS[p])) >= 5 for p in parts)  # not contiguous label blocks


def test_dirichlet_respects_min_size_and_skews():
    parts = partition_indices(LABELS, 10, "dirichlet", seed=0, alpha=0.1, min_size=10)
    sizes = [len(p) for p in parts]
    assert min(sizes) >= 10
    counts = class_counts(parts, LABELS, 10)
    # alpha 0.1 is strongly skewed: most clients are dominated by one or two classes
    top_share = counts.max(axis=1) / counts.sum(axis=1)
    assert np.median(top_share) > 0.5


def test_dirichlet_impossible_min_size_is_a_config_error():
    with pytest.raises(ConfigError, match="min-size"):
        partition_indices(LABELS, 50, "dirichlet", seed=0, alpha=0.01, min_size=20)


def test_shards_give_labels_per_client():
    parts = partition_indices(LABELS, 10, "shards", seed=0, labels_per_client=2)
    assert all(len(np.unique(LABELS[p])) <= 2 for p in parts)
    assert all(len(p) > 0 for p in parts)


def test_split_train_test_is_stratified():
    labels = np.array([0] * 8 + [1] * 4 + [2] * 1)
    idx = np.arange(len(labels))
    train, test = split_train_test(idx, labels, 0.25, np.random.default_rng(0))
    # round(8 * .25) = 2, round(4 * .25) = 1, round(1 * .25) = 0
    assert np.bincount(labels[test], minlength=3).tolist() == [2, 1, 0]
    assert np.bincount(labels[train], minlength=3).tolist() == [6, 3, 1]
    assert sorted(np.concatenate([train, test]).tolist()) == idx.tolist()


def test_emd_hand_computed():
    # two clients: [3, 1] and [0, 4]; pool p = [3/8, 5/8]
    # client 0: p_0 = [.75, .25], |.75-.375| + |.25-.625| = .75; weight 4/8
    # client 1: p_1 = [0, 1],     |0-.375| + |1-.625|     = .75; weight 4/8
    assert emd(np.array([[3, 1], [0, 4]])) == pytest.approx(0.75)
    # unequal sizes: [2, 0] and [2, 4]: p = [.5, .5]
    # c0: [1, 0] -> 1.0, weight 2/8; c1: [1/3, 2/3] -> 1/3, weight 6/8 -> .25 + .25 = .5
    assert emd(np.array([[2, 0], [2, 4]])) == pytest.approx(0.5)
    assert emd(np.array([[5, 5], [5, 5]])) == pytest.approx(0.0)
