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


def test_embedded_data_equal_scikit_learns_loaders_without_importing_it():
    """The digits and diabetes pools are read from scikit-learn's bundled files directly (its
    import costs seconds per process); the arrays must be exactly its loaders'."""
    import subprocess
    import sys

    from sklearn.datasets import load_diabetes, load_digits

    pool = load_pool("digits", None)
    digits = load_digits()
    expected = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    assert np.array_equal(pool.x.numpy(), expected) and pool.num_train == 1500
    assert np.array_equal(pool.y.numpy(), digits.target) and pool.y.dtype == torch.int64
    diabetes = load_pool("diabetes", None)
    bunch = load_diabetes(scaled=False)
    assert np.array_equal(diabetes.x.numpy(), bunch.data.astype(np.float32))
    assert np.array_equal(diabetes.y.numpy(), bunch.target.astype(np.float32))
    probe = ("import sys; from pathlib import Path; from fedapps.data.datasets import load_pool;"
             " load_pool('digits', None); load_pool('diabetes', None);"
             " print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_embedded_data_without_scikit_learn_is_a_one_line_error(monkeypatch):
    import importlib.util

    from fedapps.data import datasets
    from fedapps.errors import ConfigError

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="ship with scikit-learn: pip install scikit-learn"):
        datasets._digits()


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


# ---- source files: checksums, cache keys, one-line errors ------------------------------------
def _md5(data: bytes) -> str:
    import hashlib

    return hashlib.md5(data, usedforsecurity=False).hexdigest()


@pytest.mark.parametrize("name, folder", [
    pytest.param("mnist", "MNIST", marks=needs_mnist),
    pytest.param("fmnist", "FashionMNIST", marks=needs_fmnist),
])
def test_checksum_table_matches_torchvision_and_the_real_files(name, folder):
    """The .gz checksums are torchvision's published ones and those of the files in
    ../shared/data; the unpacked checksums are those of the gunzipped files."""
    import gzip

    import torchvision.datasets as tvd

    from fedapps.data.datasets import KNOWN_MD5

    published = dict({"mnist": tvd.MNIST, "fmnist": tvd.FashionMNIST}[name].resources)
    table = KNOWN_MD5[name]
    assert {f: m for f, m in table.items() if f.endswith(".gz")} == published
    raw = __import__("conftest").SHARED_DATA / folder / "raw"
    for gz in published:
        data = (raw / gz).read_bytes()
        assert _md5(data) == table[gz], gz
        assert _md5(gzip.decompress(data)) == table[gz.removesuffix(".gz")], gz


def _copy_mnist(dst):
    import shutil

    raw = dst / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in (__import__("conftest").SHARED_DATA / "MNIST" / "raw").iterdir():
        shutil.copyfile(f, raw / f.name)
    return raw


@needs_mnist
def test_a_modified_raw_file_is_one_line_naming_it_and_exits_2(tmp_path, monkeypatch, capsys):
    """A valid gzip with one label changed (the old code unpacked and served it from the
    cache for good): the CLI says which file, the expected and actual MD5 and what to do,
    exit code 2, before anything starts; load_pool says the same."""
    import gzip

    from fedapps.config import ConfigError
    from fedapps.data.datasets import KNOWN_MD5

    raw = _copy_mnist(tmp_path / "data")
    labels = raw / "train-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(labels.read_bytes()))
    content[8] = (content[8] + 1) % 10  # the first label
    labels.write_bytes(gzip.compress(bytes(content)))
    actual = _md5(labels.read_bytes())
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as err:
        load_pool("mnist", tmp_path / "data")
    message = str(err.value)
    assert "\n" not in message and str(labels) in message
    assert actual in message and KNOWN_MD5["mnist"][labels.name] in message
    assert "put a good copy of train-labels-idx1-ubyte.gz there" in message
    assert not (tmp_path / "cache" / "torchvision").exists()  # nothing unpacked from it

    from simulations.cli import main

    code = main(["validate", "quickstart", "--set", "dataset=mnist", "--set", "model.name=mlp",
                 "--set", f"data.data-root={tmp_path / 'data'}"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert str(labels) in lines[0] and actual in lines[0]


@needs_mnist
def test_cache_is_keyed_by_the_source_files(tmp_path, monkeypatch):
    """Two copies of the raw files: the same data in .gz and unpacked form are two sources
    with their own cache keys; a file of a dataset without published checksums keys by size
    and mtime, so a replaced copy gets its own unpacked cache; a damaged unpacked cache file
    is an error naming the cache folder."""
    import dataclasses
    import gzip
    import os

    from fedapps.config import ConfigError
    from fedapps.data import make_federated, partition_key
    from fedapps.data.datasets import DATASETS, resolve_root, source_identity

    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path / "cache"))
    gz_root = tmp_path / "gz"
    _copy_mnist(gz_root)
    plain_raw = tmp_path / "plain" / "MNIST" / "raw"
    plain_raw.mkdir(parents=True)
    for f in (gz_root / "MNIST" / "raw").iterdir():
        (plain_raw / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    a, b = source_identity("mnist", gz_root), source_identity("mnist", tmp_path / "plain")
    assert a and b and a != b
    pool = load_pool("mnist", gz_root)
    assert pool.source == a
    cached = resolve_root("mnist", gz_root)
    assert cached == tmp_path / "cache" / "torchvision" / f"MNIST-{a}"
    digits = load_pool("digits", None)
    key = partition_key(load_config("quickstart"))
    copies = [make_federated(dataclasses.replace(digits, source=s), key) for s in ("x", "y")]
    assert [fd.key["source"] for fd in copies] == ["x", "y"]  # index and transform caches

    # EMNIST has no table here: size + mtime key the cache
    emnist = tmp_path / "em" / "EMNIST" / "raw"
    emnist.mkdir(parents=True)
    for f in DATASETS["emnist"].raw_files:
        (emnist / f"{f}.gz").write_bytes(gzip.compress(b"one copy"))
    first = resolve_root("emnist", tmp_path / "em")
    target = emnist / f"{DATASETS['emnist'].raw_files[0]}.gz"
    target.write_bytes(gzip.compress(b"another, longer copy"))
    os.utime(target, ns=(1, 1))
    second = resolve_root("emnist", tmp_path / "em")
    assert first != second
    unpacked = second / "EMNIST" / "raw" / DATASETS["emnist"].raw_files[0]
    assert unpacked.read_bytes() == b"another, longer copy"

    # a damaged unpacked file in the cache (read again once the mapped pool is gone): one
    # line naming the cache folder
    victim = cached / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    victim.write_bytes(victim.read_bytes()[:-10])
    for f in (tmp_path / "cache" / "pools").glob(f"mnist-{a}-*.npy"):
        f.unlink()
    with pytest.raises(ConfigError) as err:
        load_pool("mnist", gz_root)
    assert str(cached / "MNIST" / "raw") in str(err.value) and "\n" not in str(err.value)


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


# ---- data.local-test=official-classes (seed 004, the FedRolex/HeteroFL code's data use) --------
REFERENCE_DATA = ["data.pool=official", "data.partitioner=shards", "data.labels-per-client=2",
                  "data.local-test=official-classes"]


def test_reference_data_use_trains_on_whole_shards_and_tests_on_own_classes_official_test():
    """Clients train on their whole shard of the official train split; each class's official
    test samples are dealt in equal shares to the clients holding the class (the reference's
    non_iid(test, label_split)), checked here against a recount from the partitioner itself."""
    from fedapps.data import PartitionInput, partition_key
    from fedapps.data.partition import run_partitioner

    cfg = load_config("quickstart", REFERENCE_DATA)
    fd = federated_data(cfg)
    pool, n_train = fd.pool, fd.pool.num_train
    labels = pool.y.numpy()
    key = partition_key(cfg)
    assert key["local_test"] == "official-classes" and "test_fraction" not in key
    shards = run_partitioner("shards", PartitionInput(n_train, labels=labels[:n_train],
                                                      num_classes=10),
                             10, 0, key["params"])
    for k in range(10):  # the whole shard trains; nothing of it is held back
        assert fd.train_idx[k].tolist() == sorted(shards[k].tolist())
    tested = np.concatenate(fd.test_idx)
    assert len(np.unique(tested)) == len(tested) and tested.min() >= n_train  # disjoint, official
    for c in range(10):
        holders = [k for k in range(10) if np.any(labels[shards[k]] == c)]
        sizes = [int(np.sum(labels[fd.test_idx[k]] == c)) for k in holders]
        n_c = int(np.sum(labels[n_train:] == c))
        assert sum(sizes) == n_c and max(sizes) - min(sizes) <= 1  # equal shares, all of them
        others = [k for k in range(10) if k not in holders]
        assert all(not np.any(labels[fd.test_idx[k]] == c) for k in others)
    assert sum(len(t) for t in fd.test_idx) == len(pool) - n_train  # every class is held here
    client = fd.client(3)
    assert len(client.y_train) == len(shards[3])
    assert set(client.y_test.tolist()) <= set(client.y_train.tolist())


def test_the_default_split_keeps_its_partition_key():
    from fedapps.data import clients_hold_test, partition_key

    key = partition_key(load_config("quickstart"))
    assert "local_test" not in key and key["test_fraction"] == 0.25  # caches stay valid
    assert not clients_hold_test(load_config("quickstart", ["data.test-fraction=0"]))
    assert clients_hold_test(load_config("quickstart", [*REFERENCE_DATA, "data.test-fraction=0"]))


@pytest.mark.parametrize("experiment,overrides,message", [
    ("quickstart", ["data.local-test=official"],
     "data.local-test='official': allowed: split, official-classes"),
    ("quickstart", ["data.local-test=official-classes"],
     "data.local-test='official-classes': needs data.pool=official"),
    ("regression-quick", ["data.pool=official", "data.local-test=official-classes"],
     "data.local-test='official-classes': needs class labels; dataset diabetes is regression"),
])
def test_local_test_option_is_validated_in_one_line(experiment, overrides, message):
    from fedapps.config import ConfigError
    from fedapps.validation import resolve_config

    with pytest.raises(ConfigError) as err:
        resolve_config(experiment, overrides, check_data=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def mapped_rss_kb(file_name: str) -> int:
    """This process's resident KB of the mappings of a file (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's header line
            inside = line.endswith(file_name)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@needs_fmnist
def test_a_client_build_leaves_no_pages_of_the_mapped_pool_resident():
    """Reading one partition's scattered samples maps most of the pool's file into the process
    (the kernel maps pages around each read); after the client's copies are made, its pages
    are dropped from the process, and the pool still reads the same values."""
    cfg = load_config("fedavg-fmnist", ["federation.num-clients=20"])
    data = federated_data(cfg)
    name = f"{data.pool.cache_id}-x.npy"
    assert data.pool.mapping is not None
    first = data.pool.x[:1000].clone()
    data.pool.x[data.train_idx[10]].sum()  # what building a client reads, pages kept
    held = mapped_rss_kb(name)
    assert held > 20_000, held  # 20 MB+ of the 55 MB file resident after one partition's read
    client = data.client(10)
    assert mapped_rss_kb(name) < held / 10, (held, mapped_rss_kb(name))
    assert torch.equal(data.pool.x[:1000], first)  # mapped again from the file on reading
    again = federated_data(cfg)  # the same process's cached data: the same tensors
    assert again.client(10).x_train is client.x_train
    load_pool("digits", Path(".")).release_mapped_pages()  # an in-memory pool: nothing to drop
