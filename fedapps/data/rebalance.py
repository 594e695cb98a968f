"""FedReb / FedReG rebalanced datasets (seed 000 Algorithm 1, seed 001 eq. 7, DECISIONS).

Every class a client holds is resized to one target count Q: classes with n >= Q keep Q samples
drawn without replacement; classes with 0 < n < Q keep all n and gain Q - n augmented copies of
randomly chosen originals; absent classes stay absent. Built once per client from the seed, as
the `rebalance` per-client transform (fedapps/data/transforms.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.params import Param
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    from fedapps.data import ClientData, FederatedData
    from fedapps.data.transforms import TransformContext

THRESHOLDS = ("mean", "median", "max", "secmin")
SCOPES = ("client", "global")
AUGMENTATIONS = ("simple", "auto")


def round_half_up(x: float) -> int:
    """Seeds leave rounding open; half-up keeps 120.5 -> 121 regardless of parity."""
    return int(np.floor(x + 0.5))


def statistic(values: Sequence[int], stat: str) -> float:
    """mean | median | max | secmin (second-smallest, duplicates counted) of positive values."""
    v = np.sort(np.asarray([x for x in values if x > 0], dtype=np.float64))
    if len(v) == 0:
        raise ValueError("no positive values")
    if stat == "mean":
        return float(v.mean())
    if stat == "median":
        return float(np.median(v))
    if stat == "max":
        return float(v[-1])
    if stat == "secmin":
        return float(v[1] if len(v) > 1 else v[0])
    raise ValueError(f"unknown threshold statistic {stat!r}; allowed: {', '.join(THRESHOLDS)}")


def client_target(class_counts: Sequence[int], stat: str) -> int:
    """FedReb (seed 000): t = statistic of the client's non-zero class counts."""
    return max(1, round_half_up(statistic(class_counts, stat)))


def global_target(client_sizes: Sequence[int], class_counts: Sequence[int], stat: str) -> int:
    """FedReG (seed 001 eq. 7): Q = round(T / C_k), T = statistic of all clients' train sizes,
    C_k = classes present on this client."""
    present = sum(1 for c in class_counts if c > 0)
    return max(1, round_half_up(statistic(client_sizes, stat) / present))


def effective_samples(class_counts: Sequence[int], target: int) -> int:
    """n_eff = sum_b min(n_b, Q): rebalanced samples that are originals (seed 000 eq. 3.4)."""
    return int(sum(min(int(n), target) for n in class_counts))


@dataclass(frozen=True)
class RebalancePlan:
    originals: np.ndarray  # indices (into the client's train split) kept as they are
    to_augment: np.ndarray  # indices of the originals that get one augmented copy each


def plan(labels: np.ndarray, target: int, rng: np.random.Generator) -> RebalancePlan:
    """Which originals to keep and which to copy with augmentation, per class."""
    keep, copies = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) >= target:
            keep.append(np.sort(rng.choice(members, size=target, replace=False)))
        else:
            keep.append(members)
            copies.append(rng.choice(members, size=target - len(members), replace=True))
    empty = np.zeros(0, dtype=np.int64)
    return RebalancePlan(np.concatenate(keep) if keep else empty,
                         np.concatenate(copies) if copies else empty)


def augmenter(kind: str, shape: tuple[int, ...], allow_flip: bool) -> Callable:
    """The augmentation applied once to each copied uint8 image (DECISIONS, FedReb section)."""
    from torchvision.transforms import v2

    channels, side = shape[0], shape[1]
    if kind == "auto":
        return v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)
    steps: list = [v2.RandomHorizontalFlip(0.5)] if allow_flip else []
    # padding 4 on 28/32-pixel images; scaled down for the 8x8 digits so a crop keeps the digit
    steps.append(v2.RandomCrop(side, padding=max(1, round_half_up(4 * side / 32))))
    steps.append(v2.RandomRotation(15))
    if channels == 3:
        steps.append(v2.ColorJitter(0.4, 0.4, 0.4))
    steps.append(v2.RandomAffine(0, translate=(0.1, 0.1), scale=(0.9, 1.1)))
    return v2.Compose(steps)


def augment_each(images: torch.Tensor, transform: Callable, seed: int) -> torch.Tensor:
    """Apply `transform` to each uint8 image on its own (own random parameters), reproducibly
    for a seed and without moving the global torch RNG (shared with FedAug, fedaug.py)."""
    if len(images) == 0:
        return images.clone()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.stack([transform(img) for img in images])


def augment(images: torch.Tensor, kind: str, allow_flip: bool, seed: int) -> torch.Tensor:
    """Augment each uint8 image once, reproducibly for a seed (one-off setup, not a hot loop)."""
    if len(images) == 0:
        return images.clone()
    transform = augmenter(kind, tuple(images.shape[1:]), allow_flip)
    if kind == "auto" and images.shape[1] == 1:  # AutoAugment's colour ops need 3 channels
        inner = transform

        def transform(img: torch.Tensor) -> torch.Tensor:
            return inner(img.expand(3, -1, -1))[:1]
    return augment_each(images, transform, seed)


# Digits and characters change meaning when mirrored (DECISIONS).
NO_FLIP_DATASETS = ("digits", "mnist", "emnist")


@dataclass(frozen=True)
class Rebalanced:
    x: torch.Tensor  # normalized float images of D_r
    y: torch.Tensor
    target: int  # Q (or t): samples per present class
    n_eff: int
    n_augmented: int


def rebalance_arrays(raw: torch.Tensor, labels: np.ndarray, num_classes: int,
                     train_sizes: Sequence[int], scope: str, stat: str, kind: str,
                     allow_flip: bool, seed: int, partition_id: int
                     ) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """uint8 images and labels of D_r from a client's raw train images and labels, with
    meta = [target, n_eff, n_augmented]. Seeds as in the first release, so sets never change."""
    counts = np.bincount(labels, minlength=num_classes)
    if scope == "global":
        target = global_target(list(train_sizes), counts, stat)
    else:
        target = client_target(counts, stat)
    rng = np.random.default_rng([seed, partition_id, 31])
    p = plan(labels, target, rng)
    copies = augment(raw[p.to_augment], kind, allow_flip, seed=seed * 100_003 + partition_id)
    x = torch.cat([raw[p.originals], copies])
    y = np.concatenate([labels[p.originals], labels[p.to_augment]])
    meta = np.array([target, effective_samples(counts, target), len(p.to_augment)])
    return x, y, meta


def build(fd: FederatedData, partition_id: int, dataset: str, scope: str, stat: str, kind: str,
          seed: int) -> Rebalanced:
    """D_r of one client from its train split (`fd` is a fedapps.data.FederatedData); not
    cached (the `rebalance` transform caches)."""
    idx = fd.train_idx[partition_id]
    x, y, meta = rebalance_arrays(
        fd.pool.x[idx], fd.pool.y[idx].numpy(), int(fd.pool.num_classes),
        [len(t) for t in fd.train_idx], scope, stat, kind, dataset not in NO_FLIP_DATASETS,
        seed, partition_id)
    return Rebalanced(fd.normalize(x), torch.from_numpy(y), int(meta[0]), int(meta[1]),
                      int(meta[2]))


PARAMS = (
    Param("scope", "algo.scope", str, "client", choices=SCOPES),
    Param("threshold", "algo.threshold", str, "mean", choices=THRESHOLDS),
    Param("augmentation", "algo.augmentation", str, "simple", choices=AUGMENTATIONS),
)


def transform(ctx: TransformContext, data: ClientData) -> ClientData:
    """The `rebalance` transform: adds x_reb, y_reb (D_r, normalized), n_eff, target and
    n_augmented to the client's data. Its keys stay algo.scope/threshold/augmentation so the
    FedReb/FedReG presets are unchanged; the labels are the current train labels (a transform
    listed before it, e.g. label-noise, is honoured), the images the client's raw pool images,
    so earlier transforms must keep the train rows. uint8 D_r is cached on disk."""
    fd, pid, prm = ctx.fd, ctx.partition_id, ctx.params
    idx = fd.train_idx[pid]
    if len(data.y_train) != len(idx):
        raise ConfigError("data.transforms: rebalance must come before transforms that change "
                          "the number of train samples")
    labels = data.y_train.cpu().numpy()

    def make() -> dict[str, np.ndarray]:
        x, y, meta = rebalance_arrays(
            fd.pool.x[idx], labels, int(fd.pool.num_classes), [len(t) for t in fd.train_idx],
            prm["scope"], prm["threshold"], prm["augmentation"],
            str(ctx.cfg.dataset) not in NO_FLIP_DATASETS, ctx.seed, pid)
        return {"x": x.numpy(), "y": y, "meta": meta}

    z = ctx.disk_cache(make)
    meta = z["meta"]
    return data.replace(extras={
        "x_reb": fd.normalize(torch.from_numpy(z["x"])), "y_reb": torch.from_numpy(z["y"]),
        "target": int(meta[0]), "n_eff": int(meta[1]), "n_augmented": int(meta[2])})
