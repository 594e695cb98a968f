"""Federated data: a dataset pool, partitioned once per process and cached on disk.

`federated_data(cfg)` is the one entry point. It loads the pool, partitions it with the seeded
partitioner of the table in `partition.py`, splits every client 75/25 and keeps everything as
tensors in memory; the index arrays are cached as .npz (allow_pickle=False) so a second process
reuses them. `apply_transforms` then derives each client's local data (`transforms.py`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from omegaconf import DictConfig

from fedapps.data import domains, iot  # noqa: F401  (register the domain-shift and IoT sources)
from fedapps.data.datasets import (
    DATASETS,
    DatasetInfo,
    Normalizer,
    Pool,
    cache_dir,
    check_available,
    load_pool,
)
from fedapps.data.params import Param, present, read_params
from fedapps.data.partition import (
    PARTITIONERS,
    TARGET_EMD,
    Partitioner,
    PartitionInput,
    SolveContext,
    class_counts,
    emd,
    official_test_shares,
    resolve_params,
    run_partitioner,
    split_train_test,
)
from fedapps.data.transforms import (
    TRANSFORMS,
    Transform,
    apply_transforms,
    validate_transform_settings,
)
from fedapps.errors import ConfigError
from fedapps.paths import data_root

T = TypeVar("T")

__all__ = ["DATASETS", "LOCAL_TESTS", "PARTITIONERS", "TRANSFORMS", "ClientData",
           "DatasetInfo", "FederatedData", "Normalizer", "Param", "Partitioner", "Pool",
           "Transform", "apply_transforms", "check_available", "clients_hold_test",
           "federated_data", "make_federated",
           "params_text", "partition_key", "partition_params", "validate_partition_settings",
           "validate_transform_settings"]


@dataclass(frozen=True)
class ClientData:
    """One client's local data as model tensors, plus what transforms add (`extras`).

    Extras read as attributes (`data.x_reb`, `data.n_eff`), so a client asks for what its
    algorithm's transforms provide without a subclass per combination."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:  # only reached when normal lookup fails
        extras = self.__dict__.get("extras") or {}
        if name in extras:
            return extras[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or extra {name!r}")

    def replace(self, **changes: Any) -> ClientData:
        """A copy with some of x/y train/test replaced and `extras` merged in."""
        extras = {**self.extras, **changes.pop("extras", {})}
        return dataclasses.replace(self, **changes, extras=extras)

    def to(self, device: str) -> ClientData:
        """Every tensor (extras too) on `device`."""
        def move(v: Any) -> Any:
            return v.to(device) if isinstance(v, torch.Tensor) else v
        return ClientData(move(self.x_train), move(self.y_train), move(self.x_test),
                          move(self.y_test), {k: move(v) for k, v in self.extras.items()})


@dataclass
class FederatedData:
    pool: Pool
    norm: Normalizer
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    key: dict = field(default_factory=dict)  # the partition key (names transform caches)
    _clients: dict[tuple[int, str], ClientData] = field(default_factory=dict, repr=False)
    _memo: dict[tuple, object] = field(default_factory=dict, repr=False)

    def memo(self, key: tuple, make: Callable[[], T]) -> T:
        """Per-process cache for data derived from this partition (e.g. transformed sets)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]  # type: ignore[return-value]

    @property
    def num_clients(self) -> int:
        return len(self.train_idx)

    @property
    def num_classes(self) -> int | None:
        return self.pool.num_classes

    @property
    def mean(self) -> torch.Tensor | None:
        """Input normalization mean (per channel for images, on the [0, 1] scale)."""
        return self.norm.mean

    @property
    def std(self) -> torch.Tensor | None:
        return self.norm.std

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs from raw pool samples (uint8 images, float series, token ids)."""
        return self.norm.inputs(x)

    def client(self, partition_id: int, device: str = "cpu") -> ClientData:
        """A client's normalized tensors on `device`, built once per process."""
        key = (partition_id, device)
        if key not in self._clients:
            tr, te = self.train_idx[partition_id], self.test_idx[partition_id]
            x, y = self.pool.x, self.pool.y
            targets = self.norm.targets
            tensors = (self.normalize(x[tr]), targets(y[tr]), self.normalize(x[te]),
                       targets(y[te]))
            self._clients[key] = ClientData(*(t.to(device) for t in tensors))
            self.pool.release_mapped_pages()  # the copies are made: the file's pages can go
        return self._clients[key]

    def official_test(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The dataset's official test split (for model-heterogeneous methods)."""
        x, y = self.official_test_raw()
        return self.normalize(x), y

    def official_test_raw(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The official test split's raw inputs (normalize per batch: EPIC-SOUNDS' 40,175
        clips are 8 GB as float32) and its model targets."""
        n = self.pool.num_train
        return self.pool.x[n:], self.norm.targets(self.pool.y[n:])

    def counts(self, split: str = "all") -> np.ndarray:
        """[clients, classes] label counts of the train, test or whole local data."""
        labels = self.pool.labels()
        if labels is None or self.pool.num_classes is None:
            raise ValueError("class counts need a classification dataset")
        parts = {"train": self.train_idx, "test": self.test_idx,
                 "all": [np.concatenate([a, b]) for a, b in zip(self.train_idx, self.test_idx,
                                                                 strict=True)]}[split]
        return class_counts(parts, labels, self.pool.num_classes)

    def ran_with(self) -> dict:
        """{"partitioner", "params"} from the partition key (empty without one)."""
        if "partitioner" not in self.key:
            return {}
        return {"partitioner": self.key["partitioner"], "params": dict(self.key["params"])}

    def summary(self) -> dict:
        """Partition facts recorded in results.json (regression: sizes, target scale;
        detection: sizes, boxes per client), with the partitioner and the parameters it ran
        with: for `data.target-emd` the solved ones (q, alpha, f), which the run's config.yaml
        does not hold."""
        sizes = {**self.ran_with(), "train_sizes": [len(t) for t in self.train_idx],
                 "test_sizes": [len(t) for t in self.test_idx]}
        if self.pool.labels() is None:
            total = [a + b for a, b in zip(sizes["train_sizes"], sizes["test_sizes"],
                                           strict=True)]
            facts = {"emd": None, "min_client_samples": min(total),
                     "max_client_samples": max(total), **sizes}
            if self.pool.task == "detection":
                boxes = (self.pool.y[..., 0] >= 0).sum(dim=1).numpy()
                return {**facts, "train_boxes": [int(boxes[t].sum()) for t in self.train_idx]}
            assert self.norm.target_mean is not None and self.norm.target_std is not None
            return {**facts, "target_mean": self.norm.target_mean.tolist(),
                    "target_std": self.norm.target_std.tolist()}
        counts = self.counts("all")
        return {
            "emd": emd(counts),
            "min_client_samples": int(counts.sum(axis=1).min()),
            "max_client_samples": int(counts.sum(axis=1).max()),
            "class_counts": counts.tolist(),
            **sizes,
        }


PARTITION_FORMAT = 2  # bump when the index files or the split change meaning
# data.local-test: `split` = each client's shard split by data.test-fraction (75/25);
# `official-classes` = the FedRolex/HeteroFL code's data use (seed 004): clients train on
# their whole shard and test on a share of the official test split of their own classes
LOCAL_TESTS = ("split", "official-classes")


def clients_hold_test(cfg: DictConfig) -> bool:
    """Whether clients have a local test split to evaluate on (not with test-fraction 0 and
    the split: FedAIoT's centralized test)."""
    return cfg.data.get("local-test", "split") != "split" or float(cfg.data["test-fraction"]) > 0


@lru_cache(maxsize=8)
def _class_sizes(dataset: str, root: str, download: bool, pool_mode: str) -> np.ndarray:
    """Samples per class among the partition's candidates (for the Dirichlet EMD solver)."""
    pool = load_pool(dataset, Path(root), download)
    labels = pool.labels()
    if labels is None or pool.num_classes is None:
        raise ConfigError(f"data.target-emd: dataset {dataset} has no class labels")
    n = len(pool) if pool_mode == "merged" else pool.num_train
    return np.bincount(labels[:n], minlength=pool.num_classes)


def _solve_context(cfg: DictConfig, with_data: bool) -> SolveContext:
    info = DATASETS.get(str(cfg.dataset))
    if info is None or info.num_classes is None:
        raise ConfigError(f"data.target-emd: dataset {cfg.dataset} has no class labels")
    sizes = (lambda: _class_sizes(str(cfg.dataset), str(data_root(cfg)), bool(cfg.data.download),
                                  str(cfg.data.pool))) if with_data else None
    return SolveContext(int(info.num_classes), int(cfg.federation["num-clients"]),
                        int(cfg.seed), sizes)


def partition_params(cfg: DictConfig, with_data: bool = True) -> dict[str, Any]:
    """The chosen partitioner's parameters as it runs them: read from the table, or solved for
    `data.target-emd` (seed 002 inverse solvers; the Dirichlet one reads the pool's class sizes
    unless `with_data` is false)."""
    name = str(cfg.data.partitioner)
    params = read_params(cfg, PARTITIONERS[name].params)
    target = TARGET_EMD.read(cfg) if present(cfg, TARGET_EMD.key) else None
    if target is None:
        return params
    return resolve_params(name, params, target, _solve_context(cfg, with_data))


def params_text(params: dict[str, Any]) -> str:
    """`k=v, ...` of a partitioner's parameters, as run logs and `fedapps partition` show them."""
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "-"


def partition_key(cfg: DictConfig) -> dict:
    """Everything that determines the index arrays, derived from the partitioner table: its
    name and every one of its parameters as it runs them (a target EMD's solved values, never
    another partitioner's), the dataset, pool, test fraction, number of clients, seed and the
    format version."""
    name = str(cfg.data.partitioner)
    if name not in PARTITIONERS:
        raise ConfigError(f"data.partitioner={name!r}: allowed: {', '.join(PARTITIONERS)}")
    d = cfg.data
    key = {
        "dataset": str(cfg.dataset), "pool": str(d.pool), "partitioner": name,
        "params": partition_params(cfg),
        "test_fraction": float(d["test-fraction"]),
        "num_clients": int(cfg.federation["num-clients"]), "seed": int(cfg.seed),
        "version": PARTITION_FORMAT,
    }
    local_test = str(d.get("local-test", "split"))
    if local_test != "split":  # absent for the split: existing keys (and caches) unchanged
        key["local_test"] = local_test
        del key["test_fraction"]  # not used
    if cfg.model.get("pretrained", False):  # ImageNet weights expect ImageNet statistics
        key["normalization"] = "imagenet"
    return key


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _partition(pool: Pool, key: dict, cache: bool = True
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    path = cache_dir() / "partitions" / f"{key['dataset']}-{key_digest(key)}.npz"
    k = key["num_clients"]
    if cache and path.is_file():
        with np.load(path, allow_pickle=False) as z:
            return [z[f"train{i}"] for i in range(k)], [z[f"test{i}"] for i in range(k)]
    labels = pool.labels()
    n = len(pool) if key["pool"] == "merged" else pool.num_train
    ids = pool.client_ids
    data = PartitionInput(n, labels=None if labels is None else labels[:n],
                          client_ids=None if ids is None else np.asarray(ids)[:n],
                          num_classes=pool.num_classes,
                          targets=pool.y[:n].numpy() if labels is None else None,
                          inputs=lambda: pool.x[:n])
    parts = run_partitioner(key["partitioner"], data, k, key["seed"], key["params"])
    if key.get("local_test") == "official-classes":  # validated: official pool, class labels
        assert labels is not None and pool.num_classes is not None
        train = [np.sort(p) for p in parts]
        test = official_test_shares(train, labels, pool.num_train, pool.num_classes,
                                    np.random.default_rng([key["seed"], 76]))
    else:
        rng = np.random.default_rng([key["seed"], 75])
        strata = labels if labels is not None else np.zeros(len(pool), np.int64)  # regression
        splits = [split_train_test(p, strata, key["test_fraction"], rng) for p in parts]
        train, test = [s[0] for s in splits], [s[1] for s in splits]
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **{f"train{i}": t for i, t in enumerate(train)},
                 **{f"test{i}": t for i, t in enumerate(test)})
        tmp.replace(path)
    return train, test


def make_federated(pool: Pool, key: dict, cache: bool = True) -> FederatedData:
    """Partition an in-memory pool by a `partition_key` (index files cached on disk). The
    pool's source identity joins the key, so index and transform caches built from one copy
    of the raw files are never served for another."""
    if pool.source:
        key = {**key, "source": pool.source}
    train, test = _partition(pool, {k: v for k, v in key.items() if k != "normalization"}, cache)
    norm = Normalizer.imagenet() if key.get("normalization") == "imagenet" \
        else Normalizer.for_pool(pool)
    return FederatedData(pool, norm, train, test, key)


@lru_cache(maxsize=4)
def _cached(root: str, download: bool, key_json: str) -> FederatedData:
    key = json.loads(key_json)
    return make_federated(load_pool(key["dataset"], Path(root), download), key)


def federated_data(cfg: DictConfig) -> FederatedData:
    """The partitioned dataset of this config; loaded once per process."""
    key_json = json.dumps(partition_key(cfg), sort_keys=True)
    return _cached(str(data_root(cfg)), bool(cfg.data.download), key_json)


def validate_partition_settings(cfg: DictConfig) -> None:
    """Check data.partitioner and every partitioner parameter from the table (one-line
    ConfigError naming the key); dataset-dependent rules only for the chosen partitioner."""
    name = cfg.data.partitioner
    if name not in PARTITIONERS:
        raise ConfigError(f"data.partitioner={name!r}: allowed: {', '.join(PARTITIONERS)}")
    for part in PARTITIONERS.values():  # every declared key, so a bad value never hides
        read_params(cfg, part.params)
    part = PARTITIONERS[name]
    info = DATASETS.get(str(cfg.dataset))
    if info is None:
        return
    if part.needs_labels and info.task != "classification":
        raise ConfigError(f"data.partitioner={name!r}: needs class labels; dataset "
                          f"{cfg.dataset} is {info.task}")
    if part.needs_client_ids and not info.has_client_ids:
        raise ConfigError(f"data.partitioner={name!r}: dataset {cfg.dataset} has no natural "
                          "client ids")
    if part.needs_targets and info.task != "regression":
        raise ConfigError(f"data.partitioner={name!r}: needs a regression target; dataset "
                          f"{cfg.dataset} is {info.task}")
    if part.check is not None:
        part.check(read_params(cfg, part.params), info)
    if info.num_classes is not None:  # a target EMD no setting reaches: fail before any run
        partition_params(cfg, with_data=False)

