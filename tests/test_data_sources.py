"""Generalized sources (float inputs of any shape, regression, natural client ids), the
partitioner table, its validation and the partition cache key."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedapps.config import ConfigError, load_config
from fedapps.data import (
    DATASETS,
    PARTITIONERS,
    DatasetInfo,
    Pool,
    federated_data,
    make_federated,
    partition_key,
    validate_partition_settings,
)
from fedapps.data.partition import TARGET_EMD, PartitionInput, run_partitioner
from fedapps.validation import validate


def series_pool(n_train=96, n_test=24, subjects=4) -> Pool:
    """Synthetic accelerometer-like windows: [N, 6 channels, 20 steps], 3 classes, subjects."""
    rng = np.random.default_rng(0)
    n = n_train + n_test
    x = rng.normal(5.0, 2.0, size=(n, 6, 20)).astype(np.float32)
    x[:, 0] += 100.0  # one channel on another scale: per-channel normalization must fix it
    y = np.tile(np.arange(3), n // 3 + 1)[:n].astype(np.int64)
    ids = np.concatenate([np.repeat(np.arange(subjects) * 10 + 1600, n_train // subjects),
                          np.full(n_test, 1699)])  # the official test split: one held-out id
    return Pool(torch.from_numpy(x), torch.from_numpy(y), n_train, 3, "classification",
                "channel", ids)


def tabular_regression_pool(n=200) -> Pool:
    """AEP-like: 18 features, one float target in its own units."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 18)).astype(np.float32) * np.arange(1, 19, dtype=np.float32)
    y = (x[:, 0] * 3.0 + 50.0).astype(np.float32)
    return Pool(torch.from_numpy(x), torch.from_numpy(y), 160, None, "regression", "feature")


def key(dataset="series", partitioner="iid", params=None, pool="merged", clients=4, seed=0):
    return {"dataset": dataset, "pool": pool, "partitioner": partitioner,
            "params": params or {}, "test_fraction": 0.25, "num_clients": clients, "seed": seed,
            "version": 2}


def test_time_series_source_flows_through_partitioning_and_clients():
    pool = series_pool()
    fd = make_federated(pool, key(), cache=False)
    assert sorted(np.concatenate(fd.train_idx + fd.test_idx).tolist()) == list(range(120))
    c = fd.client(2)
    assert c.x_train.shape[1:] == (6, 20) and c.x_train.dtype == torch.float32
    assert c.y_train.dtype == torch.int64
    # per-channel statistics of the official train split
    train = pool.x[:96]
    assert torch.allclose(fd.mean, train.mean(dim=(0, 2)))
    z = fd.normalize(train)
    assert torch.allclose(z.mean(dim=(0, 2)), torch.zeros(6), atol=1e-4)
    assert torch.allclose(z.std(dim=(0, 2)), torch.ones(6), atol=1e-4)
    counts = np.asarray(fd.summary()["class_counts"])
    assert counts.shape == (4, 3) and counts.sum() == 120


def test_natural_partitioner_maps_sorted_ids_to_clients():
    pool = series_pool()
    fd = make_federated(pool, key(partitioner="natural", pool="official"), cache=False)
    ids = pool.client_ids
    for k, subject in enumerate([1600, 1610, 1620, 1630]):  # sorted ids -> 0..K-1
        both = np.concatenate([fd.train_idx[k], fd.test_idx[k]])
        assert set(ids[both].tolist()) == {subject} and len(both) == 24
    with pytest.raises(ConfigError) as err:  # merged pool: 5 ids (held-out subject) for 4
        make_federated(pool, key(partitioner="natural"), cache=False)
    assert str(err.value) == ("federation.num-clients=4: data.partitioner=natural needs one "
                              "client per natural client id (5 in this pool)")


def test_natural_partitioner_needs_client_ids():
    labels = np.arange(20) % 2
    with pytest.raises(ConfigError, match="no natural client ids"):
        run_partitioner("natural", PartitionInput(20, labels=labels), 2, 0, {})


def test_regression_source_standardizes_targets_with_train_statistics():
    pool = tabular_regression_pool()
    fd = make_federated(pool, key(dataset="aep-like", clients=5), cache=False)
    c = fd.client(0)
    assert c.x_train.shape[1:] == (18,) and c.y_train.dtype == torch.float32
    train_y = pool.y[:160]
    assert fd.norm.target_mean.item() == pytest.approx(train_y.mean().item(), rel=1e-6)
    assert fd.norm.target_std.item() == pytest.approx(train_y.std().item(), rel=1e-6)
    back = fd.norm.targets_back(c.y_train)
    assert torch.allclose(back, pool.y[fd.train_idx[0]], atol=1e-4)
    # per-feature standardization from the train split
    z = fd.normalize(pool.x[:160])
    assert torch.allclose(z.mean(0), torch.zeros(18), atol=1e-5)
    s = fd.summary()
    assert s["emd"] is None and s["target_mean"] == pytest.approx(train_y.mean().item())
    assert sum(s["train_sizes"]) + sum(s["test_sizes"]) == 200
    with pytest.raises(ConfigError, match="needs class labels"):
        make_federated(pool, key(dataset="aep-like", partitioner="dirichlet",
                                 params={"alpha": 0.5, "min_size": 1}), cache=False)


def test_token_ids_pass_through_unchanged():
    x = torch.randint(0, 50, (40, 30))
    pool = Pool(x, torch.arange(40) % 4, 32, 4, "classification", "none")
    fd = make_federated(pool, key(dataset="tokens"), cache=False)
    c = fd.client(1)
    assert c.x_train.dtype == torch.int64 and torch.equal(c.x_train, x[fd.train_idx[1]])


def test_registered_source_loads_through_the_config_path(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path))
    monkeypatch.setitem(DATASETS, "synthetic-har", DatasetInfo(
        3, (6, 20), task="classification", normalization="channel", has_client_ids=True,
        loader=lambda root, download: series_pool()))
    cfg = load_config("quickstart", ["data.partitioner=natural", "data.pool=official",
                                     "federation.num-clients=4"])
    cfg.dataset = "synthetic-har"
    validate_partition_settings(cfg)
    fd = federated_data(cfg)
    assert fd.num_clients == 4 and fd.client(3).x_test.shape[1:] == (6, 20)
    assert list((tmp_path / "partitions").glob("synthetic-har-*.npz"))
    cfg.dataset = "digits"
    with pytest.raises(ConfigError, match="dataset digits has no natural client ids"):
        validate_partition_settings(cfg)


def other_value(param):
    if param.choices:
        return next(c for c in param.choices if c != param.default)
    if param.default is None:  # data.target-emd
        return 1.0
    if param.type is bool:
        return not param.default
    if param.type is int:
        return param.default + 1
    if param.high is not None:
        return param.default / 2
    return param.default * 2 + 0.5


@pytest.mark.parametrize("name", list(PARTITIONERS))
def test_cache_key_covers_every_parameter_and_only_its_own(name):
    cfg = load_config("quickstart", [f"data.partitioner={name}"])
    base = partition_key(cfg)
    assert base["partitioner"] == name
    assert set(base["params"]) == {p.name for p in PARTITIONERS[name].params}
    for part in PARTITIONERS.values():
        for p in part.params:
            if p is TARGET_EMD:  # read by every solvable partitioner: tests/test_samplers.py
                continue
            changed = cfg.copy()
            OmegaConf.update(changed, p.key, other_value(p))
            mine = p in PARTITIONERS[name].params
            assert (partition_key(changed) != base) == mine, (name, p.key)
    for k, v in [("dataset", "fmnist"), ("data.pool", "official"), ("data.test-fraction", 0.3),
                 ("federation.num-clients", 7), ("seed", 5)]:
        changed = cfg.copy()
        OmegaConf.update(changed, k, v)
        assert partition_key(changed) != base, k
    assert base["version"] >= 2


@pytest.mark.parametrize("overrides, message", [
    (["data.partitioner=zipf"], "data.partitioner='zipf': allowed: dirichlet, iid, shards, "
                                "natural, limit-label, q, limit-label-q, emd"),
    (["data.alpha=0"], "data.alpha=0: must be > 0"),
    (["data.partitioner=iid", "data.alpha=-1"], "data.alpha=-1: must be > 0"),
    (["data.min-size=0"], "data.min-size=0: must be >= 1"),
    (["data.min-size=2.5"], "data.min-size=2.5: must be an integer"),
    (["data.dirichlet-balance=cap"], "data.dirichlet-balance='cap': allowed: none, capped"),
    (["data.alpha=x"], "data.alpha='x': must be a number"),
    (["data.partitioner=shards", "data.labels-per-client=11"],
     "data.labels-per-client=11: must be <= 10"),
    (["data.partitioner=natural"], "data.partitioner='natural': dataset digits has no natural"),
])
def test_partition_settings_are_validated_from_the_table(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(load_config("quickstart", overrides), check_data=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_partition_settings_of_every_preset_validate():
    for exp in ("quickstart", "fedreb-quick"):
        validate_partition_settings(load_config(exp))
    # an unused partitioner's labels-per-client may exceed the classes (as before)
    validate_partition_settings(load_config("quickstart", ["data.labels-per-client=11"]))
