"""Composable per-client data transforms: a name -> function + typed parameters table.

A transform maps one client's local data (normalized train/test tensors plus `extras`) to new
local data, once per client and process: FedReb's rebalanced set (`rebalance`), label noise,
FedAug (`fedaug`), label averaging (`label-averaging`), per-batch crop and flip
(`crop-flip`). `data.transforms` lists them in order; an algorithm's registry entry may
require some (fedreb/fedreg: `rebalance`), which are prepended unless the list already names
them. Each step is seeded from (seed, partition id, position), memoized in
`FederatedData.memo`, and a costly step may keep its arrays on disk with `ctx.disk_cache`.

Adding a transform = one function (here or in its own module) + one `TRANSFORMS` entry (+ its
`data.<name>.*` keys in conf/defaults.yaml).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import DictConfig, ListConfig

from fedapps.data import crop_flip, fedaug, label_averaging, label_noise, rebalance
from fedapps.data.datasets import DATASETS, TASKS, DatasetInfo, cache_dir, cached_npz
from fedapps.data.params import Param, present, read_params
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    from fedapps.data import ClientData, FederatedData

TRANSFORM_FORMAT = 1  # bump when a cached transform's arrays change meaning


@dataclass(frozen=True)
class TransformContext:
    """What one step of one client's chain may use besides the local data itself."""

    cfg: DictConfig
    fd: FederatedData
    partition_id: int
    position: int  # index in the resolved chain (required transforms first)
    name: str
    params: dict[str, Any]
    cache_key: str  # digest of everything that determines this step's output

    @property
    def seed(self) -> int:
        return int(self.cfg.seed)

    def rng(self, *salt: int) -> np.random.Generator:
        """The step's own generator: (seed, partition id, position[, salt])."""
        return np.random.default_rng([self.seed, self.partition_id, self.position, *salt])

    def disk_cache(self, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Arrays of this step from the on-disk cache, or `make()` saved there atomically
        (allow_pickle=False), so a process that serves one message does not redo the work."""
        dataset = str(self.cfg.dataset)
        return cached_npz(cache_dir() / "transforms" /
                          f"{dataset}-{self.name}-{self.cache_key}.npz", make)


@dataclass(frozen=True)
class Transform:
    """`fn(ctx, data) -> data`, its parameters, and the sources it applies to."""

    fn: Callable[[TransformContext, ClientData], ClientData]
    params: tuple[Param, ...] = ()
    tasks: tuple[str, ...] = TASKS
    check: Callable[[DatasetInfo], str | None] | None = None  # why the dataset does not fit
    doc: str = ""
    # settings that need each other or the dataset (a file to read): raises ConfigError
    # (params, dataset, whether input files such as a confusion matrix are read too)
    check_params: Callable[[dict[str, Any], DatasetInfo, bool], None] | None = None


def _two_classes(info: DatasetInfo) -> str | None:
    return None if (info.num_classes or 0) >= 2 else "needs at least 2 classes"


def _images_only(info: DatasetInfo) -> str | None:
    if info.task == "detection":
        return "would move the pixels but not the boxes"
    return None if info.normalization == "image" else "augments uint8 images only"


# name -> transform. Order here is only the order of "allowed:" in messages.
TRANSFORMS: dict[str, Transform] = {
    "rebalance": Transform(rebalance.transform, rebalance.PARAMS, ("classification",),
                           _images_only,
                           "FedReb/FedReG rebalanced set D_r (extras x_reb, y_reb, n_eff, "
                           "target); params from algo.*"),
    "label-noise": Transform(label_noise.transform, label_noise.PARAMS, ("classification",),
                             _two_classes, "replace train labels by another class: each with "
                             "probability p, or exactly a ratio per client; uniformly or from "
                             "a confusion matrix (label_noise.py)", label_noise.check_params),
    "fedaug": Transform(fedaug.transform, fedaug.PARAMS, ("classification",), _images_only,
                        "seed 002 FedAug: raise the rarest classes with augmented copies to "
                        "the target augmented-EMD"),
    "label-averaging": Transform(label_averaging.transform, label_averaging.PARAMS,
                                 ("classification",), _two_classes,
                                 "oversample classes below the mean count per class over "
                                 "clients up to it (seed 003 Algorithm 3)"),
    "crop-flip": Transform(crop_flip.transform, crop_flip.PARAMS, TASKS, _images_only,
                           "seed 004's CIFAR training augmentation: every training batch "
                           "randomly cropped after black padding and flipped left-right"),
}


def transform_chain(cfg: DictConfig, required: Sequence[str] = ()
                    ) -> list[tuple[str, dict[str, Any]]]:
    """[(name, params)] in application order: required transforms not listed in
    data.transforms first, then data.transforms as written."""
    names = _listed(cfg)
    chain = [r for r in required if r not in names] + names
    return [(n, read_params(cfg, TRANSFORMS[n].params)) for n in chain]


def _listed(cfg: DictConfig) -> list[str]:
    raw = cfg.data.get("transforms", [])
    if raw is None:
        return []
    if not isinstance(raw, ListConfig | list) or not all(isinstance(n, str) for n in raw):
        raise ConfigError(f"data.transforms={raw!r}: must be a list of transform names")
    return [str(n) for n in raw]


def validate_transform_settings(cfg: DictConfig, required: Sequence[str] = (),
                                check_files: bool = True) -> None:
    """Check data.transforms and the parameters of the transforms it (and the algorithm)
    uses, from the table; one-line ConfigError naming the key. `check_files` False skips
    what reads input files (validation without the data)."""
    names = _listed(cfg)
    for n in [*required, *names]:
        if n not in TRANSFORMS:
            key = "data.transforms" if n in names else "algorithm"
            raise ConfigError(f"{key}: unknown transform {n!r}; allowed: "
                              f"{', '.join(TRANSFORMS)}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"data.transforms={names}: {dupes[0]!r} is listed twice")
    for name in TRANSFORMS:  # a declared key with a bad value never hides, used or not
        params = TRANSFORMS[name].params
        read_params(cfg, [p for p in params if present(cfg, p.key)])
    info = DATASETS.get(str(cfg.dataset))
    for name, params in transform_chain(cfg, required):
        t = TRANSFORMS[name]
        if info is None:
            continue
        why = None if info.task in t.tasks else f"needs a {' or '.join(t.tasks)} dataset"
        why = why or (t.check(info) if t.check else None)
        if why:
            raise ConfigError(f"data.transforms: {name} does not fit dataset {cfg.dataset} "
                              f"({why})")
        if t.check_params is not None:
            t.check_params(params, info, check_files)


def _step_key(fd: FederatedData, partition_id: int, seed: int,
              chain: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Digest of the partition, this client's indices, the seed and the chain so far."""
    idx = hashlib.sha256(fd.train_idx[partition_id].tobytes()
                         + fd.test_idx[partition_id].tobytes()).hexdigest()[:16]
    blob = json.dumps({"partition": fd.key, "client": partition_id, "indices": idx, "seed": seed,
                       "chain": [[n, p] for n, p in chain], "version": TRANSFORM_FORMAT},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def apply_transforms(cfg: DictConfig, fd: FederatedData, partition_id: int,
                     device: str = "cpu", required: Sequence[str] = ()) -> ClientData:
    """A client's local data after the configured transforms, built once per process.

    With no transform this is `fd.client(partition_id, device)` itself. Otherwise every step
    runs on CPU tensors (memoized per prefix, so chains sharing a prefix share work) and the
    result is moved to `device` once."""
    chain = transform_chain(cfg, required)
    if not chain:
        return fd.client(partition_id, device)
    seed = int(cfg.seed)
    spec = (seed, *((n, tuple(sorted(p.items()))) for n, p in chain))

    def run_chain() -> ClientData:
        data = fd.client(partition_id, "cpu")
        for i, (name, params) in enumerate(chain):
            ctx = TransformContext(cfg, fd, partition_id, i, name, params,
                                   _step_key(fd, partition_id, seed, chain[: i + 1]))
            data = fd.memo(("transform", partition_id, spec[: i + 2]),
                           lambda ctx=ctx, data=data: TRANSFORMS[ctx.name].fn(ctx, data))
        return data if device == "cpu" else data.to(device)

    return fd.memo(("transforms", partition_id, device, spec), run_chain)
