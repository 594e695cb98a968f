"""Dataset pools: every dataset becomes one in-memory uint8 tensor of images plus int64 labels.

Loading goes through torchvision (MNIST, FashionMNIST, EMNIST, CIFAR) or scikit-learn (the
embedded 8x8 digits). Nothing is downloaded unless the config says `data.download: true`.
The `.gz`-only copies in shared/data are unpacked once into the user cache, because
torchvision's `download=False` only accepts unpacked files and the data root may be read-only.
"""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedapps.config import ConfigError


@dataclass(frozen=True)
class Pool:
    """All images of a dataset: official train first, then official test."""

    x: torch.Tensor  # uint8 [N, C, H, W]
    y: torch.Tensor  # int64 [N]
    num_train: int  # the first num_train samples are the official train split
    num_classes: int


@dataclass(frozen=True)
class DatasetInfo:
    num_classes: int
    shape: tuple[int, int, int]
    folder: str  # torchvision folder under the data root ("" for embedded data)
    raw_files: tuple[str, ...]  # files torchvision reads from <root>/<folder>/raw (unpacked names)


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(10, (1, 8, 8), "", ()),
    "mnist": DatasetInfo(10, (1, 28, 28), "MNIST", (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")),
    "fmnist": DatasetInfo(10, (1, 28, 28), "FashionMNIST", (
        "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")),
    "emnist": DatasetInfo(47, (1, 28, 28), "EMNIST", tuple(
        f"emnist-balanced-{s}-{k}-idx{d}-ubyte"
        for s in ("train", "test") for k, d in (("images", 3), ("labels", 1)))),
    "cifar10": DatasetInfo(10, (3, 32, 32), "cifar-10-batches-py", (
        "data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
        "test_batch")),
    "cifar100": DatasetInfo(100, (3, 32, 32), "cifar-100-python", ("train", "test")),
}

# Digits has no official split; these many leading samples play the role of the train split.
DIGITS_NUM_TRAIN = 1500


def cache_dir() -> Path:
    """Where unpacked data and partition indices are cached ($FEDAPPS_CACHE or ~/.cache/fedapps)."""
    root = os.environ.get("FEDAPPS_CACHE") or Path.home() / ".cache" / "fedapps"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _raw_dir(name: str, root: Path) -> Path:
    info = DATASETS[name]
    if name.startswith("cifar"):
        return root / info.folder
    return root / info.folder / "raw"


def _has_files(folder: Path, files: tuple[str, ...], suffix: str = "") -> bool:
    return all((folder / f"{f}{suffix}").is_file() for f in files)


def _unpack_gz(src: Path, dst: Path) -> None:
    """Unpack atomically, so a crash never leaves a truncated file behind."""
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    tmp.replace(dst)


def resolve_root(name: str, root: Path) -> Path | None:
    """A torchvision root that holds `name` unpacked, unpacking `.gz` copies into the cache."""
    info = DATASETS[name]
    if not info.folder:
        return root
    raw = _raw_dir(name, root)
    if _has_files(raw, info.raw_files):
        return root
    if info.folder and _has_files(raw, info.raw_files, ".gz"):
        cached_root = cache_dir() / "torchvision"
        cached_raw = _raw_dir(name, cached_root)
        cached_raw.mkdir(parents=True, exist_ok=True)
        for f in info.raw_files:
            if not (cached_raw / f).is_file():
                _unpack_gz(raw / f"{f}.gz", cached_raw / f)
        return cached_root
    return None


def check_available(name: str, root: Path, download: bool) -> None:
    """Raise a one-line ConfigError when the dataset is missing and may not be downloaded."""
    info = DATASETS[name]
    if not info.folder or download:
        return
    raw = _raw_dir(name, root)
    if _has_files(raw, info.raw_files) or _has_files(raw, info.raw_files, ".gz"):
        return
    raise ConfigError(
        f"data.data-root={str(root)!r}: dataset {name} not found (expected {raw}/"
        f"{info.raw_files[0]}[.gz]); set data.data-root or FEDAPPS_DATA_ROOT, "
        "or data.download=true on a machine with internet"
    )


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None, :, :]
    return x, bunch.target.astype(np.int64)


def _torchvision(name: str, root: Path, download: bool) -> tuple[np.ndarray, np.ndarray]:
    import torchvision.datasets as tvd

    makers: dict[str, Callable[[bool], object]] = {
        "mnist": lambda train: tvd.MNIST(root, train=train, download=download),
        "fmnist": lambda train: tvd.FashionMNIST(root, train=train, download=download),
        "emnist": lambda train: tvd.EMNIST(root, "balanced", train=train, download=download),
        "cifar10": lambda train: tvd.CIFAR10(root, train=train, download=download),
        "cifar100": lambda train: tvd.CIFAR100(root, train=train, download=download),
    }
    xs, ys = [], []
    for train in (True, False):
        ds = makers[name](train)
        x = np.asarray(ds.data, dtype=np.uint8)  # type: ignore[attr-defined]
        x = x.transpose(0, 3, 1, 2) if x.ndim == 4 else x[:, None, :, :]
        xs.append(x)
        ys.append(np.asarray(ds.targets, dtype=np.int64))  # type: ignore[attr-defined]
    return np.concatenate(xs), np.concatenate(ys)


def load_pool(name: str, root: Path, download: bool = False) -> Pool:
    """Load a whole dataset into memory (official train first, then official test)."""
    info = DATASETS[name]
    if name == "digits":
        x, y = _digits()
        num_train = DIGITS_NUM_TRAIN
    else:
        check_available(name, root, download)
        tv_root = resolve_root(name, root) or root
        x, y = _torchvision(name, tv_root, download)
        num_train = {"cifar10": 50000, "cifar100": 50000, "emnist": 112800}.get(name, 60000)
    if x.shape[1:] != info.shape:
        raise ValueError(f"dataset {name}: images of shape {x.shape[1:]}, expected {info.shape}")
    return Pool(torch.from_numpy(x), torch.from_numpy(y), num_train, info.num_classes)
