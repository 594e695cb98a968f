"""Federated data: a dataset pool, partitioned once per process and cached on disk.

`federated_data(cfg)` is the one entry point. It loads the pool, partitions it with the seeded
partitioner, splits every client 75/25 and keeps everything as tensors in memory; the index
arrays are cached as .npz (allow_pickle=False) so a second process reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from omegaconf import DictConfig

from fedapps.config import data_root
from fedapps.data.datasets import DATASETS, Pool, cache_dir, check_available, load_pool
from fedapps.data.partition import class_counts, emd, partition_indices, split_train_test

T = TypeVar("T")

__all__ = ["DATASETS", "ClientData", "FederatedData", "check_available", "federated_data"]


@dataclass(frozen=True)
class ClientData:
    """One client's local data as normalized float tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


@dataclass
class FederatedData:
    pool: Pool
    mean: torch.Tensor  # per-channel, on the [0, 1] scale
    std: torch.Tensor
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    _clients: dict[tuple[int, str], ClientData] = field(default_factory=dict, repr=False)
    _memo: dict[tuple, object] = field(default_factory=dict, repr=False)

    def memo(self, key: tuple, make: Callable[[], T]) -> T:
        """Per-process cache for data derived from this partition (e.g. rebalanced sets)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]  # type: ignore[return-value]

    @property
    def num_clients(self) -> int:
        return len(self.train_idx)

    def normalize(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = x_uint8.float().div_(255.0)
        return (x - self.mean.view(1, -1, 1, 1)) / self.std.view(1, -1, 1, 1)

    def client(self, partition_id: int, device: str = "cpu") -> ClientData:
        """A client's normalized tensors on `device`, built once per process."""
        key = (partition_id, device)
        if key not in self._clients:
            tr, te = self.train_idx[partition_id], self.test_idx[partition_id]
            x, y = self.pool.x, self.pool.y
            tensors = (self.normalize(x[tr]), y[tr], self.normalize(x[te]), y[te])
            self._clients[key] = ClientData(*(t.to(device) for t in tensors))
        return self._clients[key]

    def official_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The dataset's official test split (for model-heterogeneous methods)."""
        n = self.pool.num_train
        return self.normalize(self.pool.x[n:]), self.pool.y[n:]

    def counts(self, split: str = "all") -> np.ndarray:
        """[clients, classes] label counts of the train, test or whole local data."""
        labels = self.pool.y.numpy()
        parts = {"train": self.train_idx, "test": self.test_idx,
                 "all": [np.concatenate([a, b]) for a, b in zip(self.train_idx, self.test_idx,
                                                                 strict=True)]}[split]
        return class_counts(parts, labels, self.pool.num_classes)

    def summary(self) -> dict:
        """Partition facts recorded in results.json."""
        counts = self.counts("all")
        return {
            "emd": emd(counts),
            "min_client_samples": int(counts.sum(axis=1).min()),
            "max_client_samples": int(counts.sum(axis=1).max()),
            "class_counts": counts.tolist(),
            "train_sizes": [len(t) for t in self.train_idx],
            "test_sizes": [len(t) for t in self.test_idx],
        }


def _partition_key(cfg: DictConfig) -> dict:
    d = cfg.data
    return {
        "dataset": cfg.dataset, "pool": d.pool, "partitioner": d.partitioner,
        "alpha": float(d.alpha) if d.partitioner == "dirichlet" else None,
        "labels_per_client": int(d["labels-per-client"]) if d.partitioner == "shards" else None,
        "min_size": int(d["min-size"]) if d.partitioner == "dirichlet" else None,
        "test_fraction": float(d["test-fraction"]),
        "num_clients": int(cfg.federation["num-clients"]), "seed": int(cfg.seed), "version": 1,
    }


def _partition(pool: Pool, key: dict) -> tuple[list[np.ndarray], list[np.ndarray]]:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "partitions" / f"{key['dataset']}-{digest}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            k = key["num_clients"]
            return [z[f"train{i}"] for i in range(k)], [z[f"test{i}"] for i in range(k)]
    labels = pool.y.numpy()
    candidates = labels if key["pool"] == "merged" else labels[: pool.num_train]
    parts = partition_indices(
        candidates, key["num_clients"], key["partitioner"], key["seed"],
        alpha=key["alpha"] or 0.1, labels_per_client=key["labels_per_client"] or 2,
        min_size=key["min_size"] or 1)
    rng = np.random.default_rng([key["seed"], 75])
    splits = [split_train_test(p, labels, key["test_fraction"], rng) for p in parts]
    train, test = [s[0] for s in splits], [s[1] for s in splits]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **{f"train{i}": t for i, t in enumerate(train)},
             **{f"test{i}": t for i, t in enumerate(test)})
    tmp.replace(path)
    return train, test


@lru_cache(maxsize=4)
def _cached(root: str, download: bool, key_json: str) -> FederatedData:
    key = json.loads(key_json)
    pool = load_pool(key["dataset"], Path(root), download)
    train, test = _partition(pool, key)
    x = pool.x.float().div_(255.0)
    mean = x.mean(dim=(0, 2, 3))
    std = x.std(dim=(0, 2, 3)).clamp_min(1e-6)
    return FederatedData(pool, mean, std, train, test)


def federated_data(cfg: DictConfig) -> FederatedData:
    """The partitioned dataset of this config; loaded once per process."""
    key_json = json.dumps(_partition_key(cfg), sort_keys=True)
    return _cached(str(data_root(cfg)), bool(cfg.data.download), key_json)
