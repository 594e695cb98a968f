"""Label-based partitioning and the EMD skew metric: pure functions on label arrays.

The partitioners are flwr-datasets' own (IID, Dirichlet, pathological), fed an in-memory
label-only dataset; only the per-client stratified train/test split and EMD are ours.
"""

from __future__ import annotations

import warnings

import numpy as np

from fedapps.config import ConfigError


def _label_dataset(labels: np.ndarray):  # -> datasets.Dataset
    from datasets import Dataset

    return Dataset.from_dict({"label": labels.tolist(), "idx": np.arange(len(labels)).tolist()})


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    seed: int,
    alpha: float = 0.1,
    labels_per_client: int = 2,
    min_size: int = 10,
) -> list[np.ndarray]:
    """Indices (into `labels`) of each client's data, for scheme iid | dirichlet | shards."""
    from flwr_datasets.partitioner import IidPartitioner, PathologicalPartitioner

    if num_clients > len(labels):
        raise ConfigError(
            f"federation.num-clients={num_clients}: more clients than samples ({len(labels)})")
    if scheme == "iid":
        part = IidPartitioner(num_partitions=num_clients)
    elif scheme == "dirichlet":
        return _dirichlet(labels, num_clients, seed, alpha, min_size)
    elif scheme == "shards":
        part = PathologicalPartitioner(
            num_partitions=num_clients, partition_by="label",
            num_classes_per_partition=labels_per_client,
            class_assignment_mode="first-deterministic", shuffle=True, seed=seed)
    else:
        raise ConfigError(f"data.partitioner={scheme!r}: allowed: dirichlet, iid, shards")
    parts = _load_all(part, labels, num_clients)
    if scheme == "iid":  # IidPartitioner splits contiguously: shuffle the assignment by seed
        perm = np.random.default_rng(seed).permutation(len(labels))
        parts = [perm[p] for p in parts]
    return parts


def _load_all(partitioner, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    partitioner.dataset = _label_dataset(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flwr-datasets warns on every Dirichlet redraw
        return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
                for i in range(num_clients)]


def _dirichlet(labels: np.ndarray, num_clients: int, seed: int, alpha: float, min_size: int,
               attempts: int = 20) -> list[np.ndarray]:
    """Seeds 000/001 (DECISIONS): per-class proportions ~ Dir(alpha * 1_N), redrawn until every
    client holds >= min_size samples; no self-balancing. flwr-datasets redraws 10 times per
    seed, so we continue with derived seeds (deterministic) before giving up."""
    from flwr_datasets.partitioner import DirichletPartitioner

    for attempt in range(attempts):
        part = DirichletPartitioner(
            num_partitions=num_clients, partition_by="label", alpha=alpha,
            min_partition_size=min_size, self_balancing=False, shuffle=True,
            seed=seed + 1_000_003 * attempt)
        try:
            return _load_all(part, labels, num_clients)
        except ValueError:
            continue
    raise ConfigError(
        f"data.alpha={alpha}: no Dirichlet draw gave all {num_clients} clients "
        f"data.min-size={min_size} samples in {attempts * 10} tries; raise alpha or lower "
        "min-size/num-clients")


def split_train_test(
    indices: np.ndarray, labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client local split, stratified: each class gives round(n * f) samples to test."""
    train, test = [], []
    client_labels = labels[indices]
    for c in np.unique(client_labels):
        members = rng.permutation(indices[client_labels == c])
        n_test = int(np.floor(len(members) * test_fraction + 0.5))
        test.append(members[:n_test])
        train.append(members[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def class_counts(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> np.ndarray:
    """[clients, classes] matrix of sample counts."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])


def emd(counts: np.ndarray) -> float:
    """Earth Mover's Distance of a partition (seed 002, DECISIONS: no 1/2 factor).

    EMD = sum_k n_k / N * sum_i |p_k(i) - p(i)|, p = the label distribution of all the data.
    """
    counts = np.asarray(counts, dtype=np.float64)
    n_k = counts.sum(axis=1)
    total = n_k.sum()
    p = counts.sum(axis=0) / total
    p_k = counts / np.maximum(n_k, 1)[:, None]
    return float(np.sum(n_k / total * np.abs(p_k - p).sum(axis=1)))
