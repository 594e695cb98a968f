"""Dataset pools: every source becomes one in-memory tensor of inputs plus targets.

Images are uint8 NCHW with int64 labels; other sources (time series, Wi-Fi CSI, spectrograms,
tabular, token ids) hold float or integer inputs of their own shape, a task (classification or
regression), a normalization and optionally a natural client id per sample. Built-in loading goes
through torchvision (MNIST, FashionMNIST, EMNIST, CIFAR) or scikit-learn (the embedded 8x8
digits); a new source is a `DatasetInfo` with a `loader`. Nothing is downloaded unless the config
says `data.download: true`.
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

from fedapps.errors import ConfigError

TASKS = ("classification", "regression")
# image: uint8 [N, C, H, W] scaled to [0, 1], per-channel mean/std over the whole pool (as the
#   seeds' pipelines did); channel: float [N, C, ...], per-channel (axis 1) mean/std of the
#   official train split; feature: float, every feature element standardized with train-split
#   statistics; none: passed through unchanged (token ids, pre-normalized data).
NORMALIZATIONS = ("image", "channel", "feature", "none")


@dataclass(frozen=True)
class Pool:
    """All samples of a dataset: official train first, then official test."""

    x: torch.Tensor  # uint8 [N, C, H, W] images, float32 [N, *input_shape], or int64 token ids
    y: torch.Tensor  # int64 labels [N] (classification) or float32 targets [N] / [N, d]
    num_train: int  # the first num_train samples are the official train split
    num_classes: int | None  # None for regression
    task: str = "classification"
    normalization: str = "image"
    client_ids: np.ndarray | None = None  # natural client id per sample (subject, home, ...)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: allowed: {', '.join(TASKS)}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization {self.normalization!r}: allowed: "
                             f"{', '.join(NORMALIZATIONS)}")
        if len(self.x) != len(self.y) or not 0 < self.num_train <= len(self.y):
            raise ValueError(f"pool: {len(self.x)} inputs, {len(self.y)} targets, "
                             f"num_train {self.num_train}")
        if self.client_ids is not None and len(self.client_ids) != len(self.y):
            raise ValueError(f"pool: {len(self.client_ids)} client ids for {len(self.y)} samples")

    def __len__(self) -> int:
        return len(self.y)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def labels(self) -> np.ndarray | None:
        """Class labels for label-based partitioners and stratified splits (None: regression)."""
        return self.y.numpy() if self.task == "classification" else None


@dataclass(frozen=True)
class Normalizer:
    """How a pool's inputs and targets become model tensors; statistics fitted once per pool.

    Regression targets are standardized with official-train statistics; `target_mean` and
    `target_std` are kept so predictions and errors can be converted back to the data's units."""

    kind: str
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None
    target_mean: torch.Tensor | None = None
    target_std: torch.Tensor | None = None

    @staticmethod
    def fit(pool: Pool) -> Normalizer:
        kind, x = pool.normalization, pool.x
        mean = std = None
        if kind == "image":  # legacy: over the whole pool, on the [0, 1] scale
            xf = x.float().div_(255.0)
            mean = xf.mean(dim=(0, 2, 3))
            std = xf.std(dim=(0, 2, 3)).clamp_min(1e-6)
        elif kind in ("channel", "feature"):
            train = x[: pool.num_train].float()
            dims = (0,) if kind == "feature" else (0, *range(2, train.dim()))
            mean = train.mean(dim=dims)
            std = train.std(dim=dims).clamp_min(1e-6)
        t_mean = t_std = None
        if pool.task == "regression":
            train_y = pool.y[: pool.num_train].float()
            t_mean, t_std = train_y.mean(dim=0), train_y.std(dim=0).clamp_min(1e-6)
        return Normalizer(kind, mean, std, t_mean, t_std)

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "feature":
            return t.unsqueeze(0)
        return t.view(1, -1, *([1] * (x.dim() - 2)))

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Model inputs from raw pool samples (any leading count)."""
        if self.kind == "none":
            return x
        assert self.mean is not None and self.std is not None
        xf = x.float().div_(255.0) if self.kind == "image" else x.float()
        return (xf - self._view(self.mean, xf)) / self._view(self.std, xf)

    def targets(self, y: torch.Tensor) -> torch.Tensor:
        """Training targets: labels unchanged, regression targets standardized."""
        if self.target_mean is None or self.target_std is None:
            return y
        return (y.float() - self.target_mean) / self.target_std

    def targets_back(self, y: torch.Tensor) -> torch.Tensor:
        """Standardized regression targets (or predictions) in the data's own units."""
        if self.target_mean is None or self.target_std is None:
            return y
        return y * self.target_std.to(y.device) + self.target_mean.to(y.device)


@dataclass(frozen=True)
class DatasetInfo:
    """What the config layer and models need to know about a source before loading it."""

    num_classes: int | None  # None for regression (models then output `targets` values)
    shape: tuple[int, ...]  # input shape of one sample (`input_shape`)
    folder: str = ""  # torchvision folder under the data root ("" for embedded/custom data)
    raw_files: tuple[str, ...] = ()  # files torchvision reads from <root>/<folder>/raw
    task: str = "classification"
    normalization: str = "image"
    has_client_ids: bool = False  # the source gives every sample a natural client id
    # custom sources: (data root, download allowed) -> Pool; None = the built-in loaders
    loader: Callable[[Path, bool], Pool] | None = None
    # custom sources: raise a one-line ConfigError when the data is missing (before any run)
    check: Callable[[Path], None] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.shape


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
DIABETES_NUM_TRAIN = 350  # likewise for diabetes (442 patients): the last 92 are the test split


def _diabetes(root: Path, download: bool) -> Pool:
    """scikit-learn's bundled diabetes data (Efron et al. 2004): 442 patients, 10 baseline
    features, disease progression after one year as the target. Embedded (no download): the
    offline regression source that exercises the regression task end to end."""
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes(scaled=False)
    x = torch.from_numpy(bunch.data.astype(np.float32))
    y = torch.from_numpy(bunch.target.astype(np.float32))
    return Pool(x, y, DIABETES_NUM_TRAIN, None, task="regression", normalization="feature")


DATASETS["diabetes"] = DatasetInfo(None, (10,), task="regression", normalization="feature",
                                   loader=_diabetes)


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
    if not info.folder or info.loader is not None:
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
    if info.check is not None:
        info.check(root)
    if not info.folder or download or info.loader is not None:
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
    if info.loader is not None:
        pool = info.loader(root, download)
        if pool.input_shape != tuple(info.shape) or pool.task != info.task \
                or pool.normalization != info.normalization:
            raise ValueError(f"dataset {name}: loader gave {pool.task}/{pool.normalization} "
                             f"samples of shape {pool.input_shape}, expected {info.task}/"
                             f"{info.normalization} {tuple(info.shape)}")
        return pool
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
