"""Seed 004 FedAIoT partition schemes (s.2.2.1, B1, B2): the reference's Dirichlet variant
(capacity rule, redraws, repair) over classes, target quantile bins and feature clusters, and
disjoint-label shards; hand-computed cases, an independent re-implementation of the counts, and
the config layer (keys, validation, `fedapps partition`)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

import fedapps.pretrained as pretrained
from fedapps.config import load_config
from fedapps.data import partition_key
from fedapps.data.fedaiot_partition import (
    allocate,
    disjoint_label,
    feature_clusters,
    fedaiot_dirichlet,
    quantile_bins,
    repair,
)
from fedapps.data.partition import PartitionInput, run_partitioner
from fedapps.errors import ConfigError
from fedapps.validation import validate
from tests.visdrone_fixture import write_fixture


def test_a_client_at_capacity_gets_no_share_of_later_classes():
    # 3 clients, 12 samples: capacity 4. Class 0 (6 samples) by [.7, .2, .1]: cuts
    # int([4.2, 5.4]) = [4, 5] -> 4, 1, 1. Client 0 is now at capacity, so class 1's
    # [.5, .25, .25] becomes [0, .5, .5]: cuts [0, 3] -> 0, 3, 3.
    props = np.array([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]])
    assert allocate(np.array([6, 6]), props, 4.0).tolist() == [[4, 0], [1, 3], [1, 3]]
    # without the rule class 1 would be cut at int([3, 4.5]) -> 3, 1, 2
    assert allocate(np.array([6, 6]), props, np.inf).tolist() == [[4, 3], [1, 1], [1, 2]]
    # every open client with a zero proportion (underflow): the open ones share equally
    flat = np.array([[1.0, 0, 0], [1.0, 0, 0]])
    assert allocate(np.array([4, 4]), flat, 8 / 3).tolist() == [[4, 0], [0, 2], [0, 2]]


def test_repair_moves_the_largest_clients_last_samples_to_the_smallest():
    parts = repair([np.arange(7), np.array([7]), np.array([8, 9, 10])], 3)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3, 4], [7, 5, 6], [8, 9, 10]]
    # two moves: client 1 (0 samples) takes 4, 5 from client 0; then client 2 (1) takes 3
    parts = repair([np.arange(6), np.array([], np.int64), np.array([6])], 2)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [4, 5], [6, 3]]


def straight_counts(labels, num_clients, seed, alpha):
    """Independent re-implementation of one draw's counts (plain loops, the B1 text)."""
    rng = np.random.default_rng([seed, 4])
    m = int(labels.max()) + 1
    props = rng.dirichlet([alpha] * num_clients, size=m)
    have = [0] * num_clients
    out = np.zeros((num_clients, m), np.int64)
    for k in range(m):
        n_k = int((labels == k).sum())
        p = [props[k][j] if have[j] < len(labels) / num_clients else 0.0
             for j in range(num_clients)]
        total, acc, prev = sum(p), 0.0, 0
        for j in range(num_clients):
            acc += p[j] / total
            cut = n_k if j == num_clients - 1 else int(acc * n_k)
            out[j, k] = cut - prev
            have[j] += cut - prev
            prev = cut
    return out


def test_fedaiot_dirichlet_counts_min_size_and_seeds():
    labels = np.repeat(np.arange(5), 40)  # 200 samples, 5 classes
    run = lambda seed, **kw: fedaiot_dirichlet(  # noqa: E731
        labels, 4, np.random.default_rng([seed, 4]), kw.get("alpha", 5.0),
        kw.get("min_size", 20), kw.get("max_iterations", 10_000))
    parts = run(0)  # alpha 5: the first draw already gives everyone >= 20
    counts = np.stack([np.bincount(labels[p], minlength=5) for p in parts])
    assert counts.tolist() == straight_counts(labels, 4, 0, 5.0).tolist()
    props = np.random.default_rng([0, 4]).dirichlet([5.0] * 4, size=5)
    assert counts.tolist() != allocate(np.full(5, 40), props, np.inf).tolist()  # rule used
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))
    for kw in ({"alpha": 0.05}, {"alpha": 0.05, "max_iterations": 1}):  # repair needed
        parts = run(1, **kw)
        assert min(len(p) for p in parts) >= 20
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(200))
    assert all(np.array_equal(a, b) for a, b in zip(run(3), run(3), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(run(3), run(4), strict=True))
    with pytest.raises(ConfigError, match=r"^data.fedaiot.min-size=60: 4 clients x 60 > 200 "
                                          r"samples$"):
        run(0, min_size=60)


def test_quantile_bins_are_equal_frequency_by_rank():
    assert quantile_bins(np.array([5, 3, 9, 1, 7, 2, 8, 4, 6, 0.0]), 5).tolist() \
        == [2, 1, 4, 0, 3, 1, 4, 2, 3, 0]
    assert quantile_bins(np.array([1, 1, 1, 1, 2, 2.0]), 3).tolist() == [0, 0, 1, 1, 2, 2]
    sizes = np.bincount(quantile_bins(np.random.default_rng(0).normal(size=23), 10))
    assert sorted(sizes.tolist()) == [2] * 7 + [3] * 3
    with pytest.raises(ConfigError, match=r"one-dimensional regression target \(this one has "
                                          r"shape \[2\]\)$"):
        quantile_bins(np.zeros((5, 2)), 3)


def same_grouping(found, truth):
    """Clusters equal the truth up to renaming: a bijection of labels."""
    pairs = set(zip(found.tolist(), truth.tolist(), strict=True))
    return len(pairs) == len(set(truth.tolist())) == len(set(found.tolist()))


def test_kmeans_on_raw_features_recovers_separated_blobs():
    rng = np.random.default_rng(0)
    truth = rng.permutation(np.repeat(np.arange(3), 30))
    centers = np.array([[0, 0, 0, 0], [10, 0, 10, 0], [0, 10, 0, 10.0]])
    x = torch.tensor(centers[truth] + rng.normal(size=(90, 4)), dtype=torch.float32)
    found = feature_clusters(x.reshape(90, 1, 2, 2), 3, "raw", seed=0)
    assert same_grouping(found, truth)


def test_vgg19_clusters_use_the_published_weights_file(tmp_path, monkeypatch):
    images = torch.zeros(16, 3, 32, 32, dtype=torch.uint8)
    truth = np.arange(16) % 2
    images[truth == 1] = 255  # white images, black ones
    images[:, :, 8:24, 8:24] = 128
    missing = tmp_path / pretrained.VGG19_FILE
    monkeypatch.setattr(pretrained, "vgg19_weights_path", lambda: missing)
    with pytest.raises(ConfigError, match="^data.fedaiot.cluster-features=vgg19: no ImageNet "
                                          ".* or set data.fedaiot.cluster-features=raw$"):
        feature_clusters(images, 2, "vgg19", seed=0)
    torch.manual_seed(0)
    blob = tmp_path / "blob.pth"
    torch.save({f"features.{k}": v for k, v in pretrained.vgg19_features().state_dict().items()},
               blob)
    good = blob.rename(tmp_path / f"vgg19-{hashlib.sha256(blob.read_bytes()).hexdigest()[:8]}.pth")
    monkeypatch.setattr(pretrained, "vgg19_weights_path", lambda: good)
    assert same_grouping(feature_clusters(images, 2, "vgg19", seed=0), truth)
    with pytest.raises(ConfigError, match=r"needs uint8 \[3, >=32, >=32\] images"):
        feature_clusters(images[:, :1], 2, "vgg19", seed=0)


def test_disjoint_label_shards_by_hand():
    # 3 classes, 3 clients, 2 labels each: s = 2 shards per class. Class 0 = samples 0..4:
    # shards [0, 1] + leftover 4 and [2, 3]; class 1 = 5..8: [5, 6], [7, 8]; class 2 = 9..14:
    # [9, 10, 11], [12, 13, 14].
    labels = np.array([0] * 5 + [1] * 4 + [2] * 6)
    shards = {(0, 1, 4), (2, 3), (5, 6), (7, 8), (9, 10, 11), (12, 13, 14)}
    for seed in range(5):
        parts = disjoint_label(labels, 3, 3, 2, np.random.default_rng(seed))
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(15))
        for p in parts:
            assert len(set(labels[p])) <= 2
            held = {s for s in shards if set(s) <= set(p.tolist())}
            assert sum(len(s) for s in held) == len(p) and len(held) == 2
    a = disjoint_label(labels, 3, 3, 2, np.random.default_rng(7))
    assert all(np.array_equal(x, y) for x, y in zip(
        a, disjoint_label(labels, 3, 3, 2, np.random.default_rng(7)), strict=True))
    with pytest.raises(ConfigError, match=r"^data.labels-per-client=2: labels-per-client x "
                                          r"num-clients \(2 x 4\) must be a multiple of the 3"):
        disjoint_label(labels, 3, 4, 2, np.random.default_rng(0))


def test_uniform_is_our_iid_and_natural_needs_no_new_entry():
    """The reference's UniformPartition (a permutation cut by np.array_split) is `iid`."""
    data = PartitionInput(23, labels=np.zeros(23, np.int64))
    perm = np.random.default_rng(3).permutation(23)
    assert all(np.array_equal(a, b) for a, b in zip(
        run_partitioner("iid", data, 4, 3, {}), np.array_split(perm, 4), strict=True))


def test_keys_hold_every_parameter_and_validation_is_one_line(tmp_path, monkeypatch):
    quant = ["data.partitioner=fedaiot-quantiles"]
    key = partition_key(load_config("regression-quick", quant))
    assert key["params"] == {"alpha": 0.1, "min_size": 20, "max_iterations": 10_000,
                             "bins": 10}
    for extra in ("data.alpha=0.5", "data.fedaiot.min-size=10", "data.fedaiot.max-iterations=1",
                  "data.fedaiot.bins=5"):
        assert partition_key(load_config("regression-quick", [*quant, extra])) != key
    clusters = partition_key(load_config("quickstart", ["data.partitioner=fedaiot-clusters",
                                                        "data.fedaiot.clusters=4"]))
    assert clusters["params"] == {"alpha": 0.5, "min_size": 20, "max_iterations": 10_000,
                                  "clusters": 4, "features": "raw"}
    for overrides, message in [
        (["data.partitioner=fedaiot-quantiles"], "data.partitioner='fedaiot-quantiles': needs "
         "a regression target; dataset digits is classification"),
        (["data.partitioner=fedaiot-clusters", "data.fedaiot.cluster-features=vgg19"],
         "data.fedaiot.cluster-features=vgg19: needs [3, >=32, >=32] images (this dataset: "
         "[1, 8, 8]); use data.fedaiot.cluster-features=raw"),
        (["data.fedaiot.cluster-features=knn"], "data.fedaiot.cluster-features='knn': allowed: "
         "raw, vgg19"),
        (["data.fedaiot.bins=1"], "data.fedaiot.bins=1: must be >= 2"),
        (["data.partitioner=disjoint-label", "data.labels-per-client=11"],
         "data.labels-per-client=11: must be <= 10"),
    ]:
        with pytest.raises(ConfigError) as err:
            validate(load_config("quickstart", overrides), check_data=False)
        assert str(err.value).startswith(message) and "\n" not in str(err.value)
    monkeypatch.setattr(pretrained, "vgg19_weights_path", lambda: tmp_path / "vgg19-0.pth")
    write_fixture(tmp_path)  # VisDrone's images: a dataset the VGG-19 clusters fit
    visdrone = load_config("fedaiot-visdrone", [f"data.data-root={tmp_path}"])
    validate(visdrone, check_data=False)  # the weights are data: checked with the data
    with pytest.raises(ConfigError, match="^data.fedaiot.cluster-features=vgg19: no ImageNet "
                                          "weights at "):
        validate(visdrone, check_data=True)
    with pytest.raises(ConfigError, match="^data.partitioner=fedaiot-quantiles: needs a "
                                          "regression target; this dataset has none$"):
        run_partitioner("fedaiot-quantiles", PartitionInput(10, labels=np.zeros(10, np.int64)),
                        2, 0, {"alpha": 1.0, "min_size": 1, "max_iterations": 1, "bins": 2})


def test_partition_command_prints_target_bins_for_diabetes(tmp_path, capsys, monkeypatch):
    from simulations.cli import main

    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "p.json"
    assert main(["partition", "regression-quick", "--set", "data.partitioner=fedaiot-quantiles",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "on diabetes, 5 clients, 10 target bins" in lines[0]
    report = json.loads(out.read_text())
    counts = np.array(report["class_counts"])
    assert sorted(counts.sum(axis=0).tolist()) == [44] * 8 + [45] * 2  # 442 in 10 bins
    assert min(report["sizes"]) >= 20 and report["emd"] > 0.5  # alpha 0.1: strongly skewed
