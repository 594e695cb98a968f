from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import needs_fmnist, needs_mnist

from fedapps.config import load_config
from fedapps.data import federated_data
from fedapps.data.datasets import load_pool
from fedapps.data.partition import emd


def test_embedded_digits_pool():
    pool = load_pool("digits", None)
    assert pool.x.shape == (1797, 1, 8, 8) and pool.x.dtype == torch.uint8
    assert int(pool.x.max()) == 255 and pool.num_classes == 10


def test_federated_data_is_cached_and_consistent():
    cfg = load_config("quickstart")
    a = federated_data(cfg)
    assert federated_data(cfg) is a  # loaded once per process
    s = a.summary()
    counts = np.asarray(s["class_counts"])
    assert counts.sum() == 1797  # merged pool: every sample belongs to one client
    assert s["emd"] == pytest.approx(emd(counts))
    assert [len(t) for t in a.train_idx] == s["train_sizes"]
    c = a.client(0)
    assert len(c.y_train) == s["train_sizes"][0] and len(c.y_test) == s["test_sizes"][0]
    assert c.x_train.dtype == torch.float32
    total = sum(s["train_sizes"]) + sum(s["test_sizes"])
    assert sum(s["test_sizes"]) / total == pytest.approx(0.25, abs=0.03)


def test_official_pool_partitions_only_the_train_split():
    cfg = load_config("quickstart", ["data.pool=official"])
    data = federated_data(cfg)
    assert int(np.asarray(data.summary()["class_counts"]).sum()) == 1500
    x, y = data.official_test()
    assert len(y) == 297


@needs_fmnist
def test_fmnist_from_shared_data():
    pool = load_pool("fmnist", __import__("conftest").SHARED_DATA)
    assert pool.x.shape == (70000, 1, 28, 28)
    assert np.bincount(pool.y.numpy()).tolist() == [7000] * 10


@needs_mnist
def test_mnist_train_class_counts_match_the_release():
    pool = load_pool("mnist", __import__("conftest").SHARED_DATA)
    counts = np.bincount(pool.y[: pool.num_train].numpy()).tolist()
    assert counts == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


@needs_fmnist
def test_fmnist_pool_is_mapped_from_the_cache_and_normalizes_as_fitted():
    """A process maps the pool from a .npy cache (it reads only the samples it indexes) and
    reads the normalization statistics from the cache, bit for bit the fitted ones."""
    from fedapps.data.datasets import Normalizer, _torchvision, resolve_root

    root = __import__("conftest").SHARED_DATA
    load_pool("fmnist", root)  # makes the cache files if this is the first time
    pool = load_pool("fmnist", root)
    start = pool.x.untyped_storage().data_ptr()
    lines = Path("/proc/self/maps").read_text().splitlines()
    maps = [line.split() for line in lines if f"{pool.cache_id}-x.npy" in line]
    assert any(int(m[0].split("-")[0], 16) <= start < int(m[0].split("-")[1], 16) for m in maps)
    x, y = _torchvision("fmnist", resolve_root("fmnist", root), False)
    assert np.array_equal(pool.x.numpy(), x) and np.array_equal(pool.y.numpy(), y)
    Normalizer.for_pool(pool)  # fitted and cached if it was not yet
    cached, fitted = Normalizer.for_pool(pool), Normalizer.fit(pool)
    assert torch.equal(cached.mean, fitted.mean) and torch.equal(cached.std, fitted.std)
