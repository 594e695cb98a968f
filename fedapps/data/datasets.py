"""Dataset pools: every source becomes one in-memory tensor of inputs plus targets.

Images are uint8 NCHW with int64 labels; other sources (time series, Wi-Fi CSI, spectrograms,
tabular, token ids) hold float or integer inputs of their own shape, a task (classification or
regression), a normalization and optionally a natural client id per sample. Built-in loading goes
through torchvision (MNIST, FashionMNIST, EMNIST, CIFAR) or scikit-learn (the embedded 8x8
digits); a new source is a `DatasetInfo` with a `loader`. Nothing is downloaded unless the config
says `data.download: true`.
The `.gz`-only copies in shared/data are unpacked once into the user cache, because
torchvision's `download=False` only accepts unpacked files and the data root may be read-only.
The cache is keyed by the source files' identity (`source_identity`: MD5 checksums, verified
against the published ones for MNIST and Fashion-MNIST; size and mtime for the others), so a
different or repaired copy of the raw files never meets an older copy's unpacked files or
partitions, and a damaged file is a one-line error naming it instead of a parser's traceback.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import mmap
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fedapps.data.idx import read_idx_split
from fedapps.errors import ConfigError

TASKS = ("classification", "regression", "detection")
# image: uint8 [N, C, H, W] scaled to [0, 1], per-channel mean/std over the whole pool (as the
#   seeds' pipelines did); channel: float [N, C, ...], per-channel (axis 1) mean/std of the
#   official train split; feature: float, every feature element standardized with train-split
#   statistics; unit: uint8 images scaled to [0, 1] only (detectors: YOLO's input); none: passed
#   through unchanged (token ids, pre-normalized data).
NORMALIZATIONS = ("image", "channel", "feature", "unit", "none")
# torchvision's ImageNet statistics (RGB, [0, 1] scale), for ImageNet-pretrained models
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Pool:
    """All samples of a dataset: official train first, then official test."""

    x: torch.Tensor  # uint8 [N, C, H, W] images, float [N, *input_shape], or int64 token ids
    # int64 labels [N] (classification), float32 targets [N] / [N, d] (regression) or padded
    # boxes [N, M, 5] (detection: class, cx, cy, w, h; class -1 pads)
    y: torch.Tensor
    num_train: int  # the first num_train samples are the official train split
    num_classes: int | None  # None for regression
    task: str = "classification"
    normalization: str = "image"
    client_ids: np.ndarray | None = None  # natural client id per sample (subject, home, ...)
    source: str = ""  # identity of the files it was read from (keys the caches); "" = embedded
    cache_id: str | None = None  # names on-disk caches of this pool's files (see pool_files)
    # the file mapping x is read from (pool_files, the IoT feature caches; `file_mapping`)
    mapping: mmap.mmap | None = field(default=None, repr=False, compare=False)

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

    def release_mapped_pages(self) -> None:
        """Drop this process's resident pages of a file-mapped x. Reading one partition's
        scattered samples maps most of the file into the process (the kernel maps the pages
        around each one it reads): 40 MB of Fashion-MNIST's 55 MB for one client of 20, held in
        the process's resident memory for as long as the mapping lives (docs/PERFORMANCE.md,
        "A lean node"). A client's tensors are copies and x is never written (a copy-on-write
        mapping), so nothing is lost; a later read maps the pages again from the page cache."""
        if self.mapping is not None and not self.mapping.closed:
            self.mapping.madvise(mmap.MADV_DONTNEED)


def file_mapping(array: np.ndarray) -> mmap.mmap | None:
    """The mmap behind an `np.load(..., mmap_mode=...)` array (for Pool.mapping), else None."""
    mapping = getattr(array, "_mmap", None)
    return mapping if isinstance(mapping, mmap.mmap) else None


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
    def for_pool(pool: Pool) -> Normalizer:
        """`fit`, read from the cache when this pool's statistics were fitted before: fitting
        an image pool reads every sample as float (70,000 FMNIST images: 220 MB), which a
        process that only needs its own partition should not pay for every time. Cached as
        the fitted float32 values, so a cached normalizer is the fitted one bit for bit."""
        if pool.cache_id is None:
            return Normalizer.fit(pool)
        path = cache_dir() / "pools" / f"{pool.cache_id}-norm.npz"
        fields = ("mean", "std", "target_mean", "target_std")
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                kind = str(z["kind"])
                if kind == pool.normalization:
                    return Normalizer(kind, *(torch.from_numpy(z[f]) if f in z else None
                                              for f in fields))
        norm = Normalizer.fit(pool)
        arrays = {f: getattr(norm, f).numpy() for f in fields if getattr(norm, f) is not None}
        _save_npz(path, kind=np.array(norm.kind), **arrays)
        return norm

    @staticmethod
    def imagenet() -> Normalizer:
        """ImageNet's per-channel statistics on the [0, 1] scale (torchvision's published
        values): what ImageNet-pretrained weights expect, instead of the pool's own."""
        return Normalizer("image", torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD))

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
        """Model inputs from raw pool samples (any leading count); float inputs stored at
        lower precision (EPIC-SOUNDS' float16 cache) become float32."""
        if self.kind == "none":
            return x.float() if x.is_floating_point() else x
        if self.kind == "unit":
            return x.float().div_(255.0)
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
    vocab_size: int | None = None  # token-id sources: size of the embedding table the model needs
    # custom sources: the loader fetches the data itself when data.download=true, so `check`
    # (the missing-data error) is skipped then
    downloadable: bool = False

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
    x = torch.from_numpy(_bundled_csv("diabetes_data_raw.csv.gz").astype(np.float32))
    y = torch.from_numpy(_bundled_csv("diabetes_target.csv.gz").astype(np.float32))
    return Pool(x, y, DIABETES_NUM_TRAIN, None, task="regression", normalization="feature")


DATASETS["diabetes"] = DatasetInfo(None, (10,), task="regression", normalization="feature",
                                   loader=_diabetes)


# MD5 of the files torchvision reads for MNIST and Fashion-MNIST: the .gz files exactly as
# torchvision publishes them (torchvision/datasets/mnist.py `resources`) and their unpacked
# contents (for a data root that holds unpacked files). tests/test_datasets.py checks both
# against the files in ../shared/data and the .gz ones against torchvision's own list.
KNOWN_MD5: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "fmnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}


class BadSourceFile(ConfigError):
    """A raw data file that is not the published one (a damaged or different copy)."""


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


_md5_memo: dict[tuple[str, int, int], str] = {}


def file_md5(path: Path) -> str:
    """MD5 of a file, computed once per process for a given path, size and mtime."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _md5_memo:
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _md5_memo[key] = digest.hexdigest()
    return _md5_memo[key]


def source_files(name: str, root: Path) -> list[Path]:
    """The raw files torchvision will read for `name`: unpacked ones if all are there, else
    the `.gz` copies; [] for embedded data or when the files are missing."""
    info = DATASETS[name]
    if not info.folder or info.loader is not None:
        return []
    raw = _raw_dir(name, root)
    for suffix in ("", ".gz"):
        if _has_files(raw, info.raw_files, suffix):
            return [raw / f"{f}{suffix}" for f in info.raw_files]
    return []


def verify_sources(name: str, files: list[Path]) -> None:
    """Raise a one-line BadSourceFile for a file whose MD5 is not the published one (MNIST,
    Fashion-MNIST: every file; other datasets have no table and pass)."""
    known = KNOWN_MD5.get(name, {})
    for path in files:
        expected = known.get(path.name)
        if expected is None:
            continue
        actual = file_md5(path)
        if actual != expected:
            raise BadSourceFile(
                f"dataset {name}: {path} is damaged or not the published file (md5 {actual}, "
                f"expected {expected}); put a good copy of {path.name} there (torchvision's "
                f"{DATASETS[name].folder} release), or delete it and set data.download=true")


def source_identity(name: str, root: Path) -> str:
    """A digest of the source files that keys every cache built from them: their MD5s where
    the published ones are known (verified first), else their names, sizes and mtimes."""
    files = source_files(name, root)
    verify_sources(name, files)
    parts = []
    for path in files:
        if path.name in KNOWN_MD5.get(name, {}):
            parts.append(f"{path.name}:md5:{file_md5(path)}")
        else:
            st = path.stat()
            parts.append(f"{path.name}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16] if parts else ""


def _unpack_gz(src: Path, dst: Path) -> None:
    """Unpack atomically, so a crash never leaves a truncated file behind."""
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    tmp.replace(dst)


def resolve_root(name: str, root: Path, identity: str | None = None) -> Path | None:
    """A torchvision root that holds `name` unpacked, unpacking `.gz` copies into the cache
    under `<cache>/torchvision/<folder>-<source identity>/`."""
    info = DATASETS[name]
    if not info.folder or info.loader is not None:
        return root
    raw = _raw_dir(name, root)
    if _has_files(raw, info.raw_files):
        return root
    if info.folder and _has_files(raw, info.raw_files, ".gz"):
        identity = identity or source_identity(name, root)
        cached_root = cache_dir() / "torchvision" / f"{info.folder}-{identity}"
        cached_raw = _raw_dir(name, cached_root)
        cached_raw.mkdir(parents=True, exist_ok=True)
        for f in info.raw_files:
            if not (cached_raw / f).is_file():
                _unpack_gz(raw / f"{f}.gz", cached_raw / f)
        return cached_root
    return None


def check_available(name: str, root: Path, download: bool) -> None:
    """Raise a one-line ConfigError when the dataset is missing and may not be downloaded,
    or a BadSourceFile when a raw file is not the published one."""
    info = DATASETS[name]
    if info.check is not None and not (download and info.downloadable):
        info.check(root)
    if not info.folder or info.loader is not None:
        return
    files = source_files(name, root)
    verify_sources(name, files)
    if files or download:
        return
    raw = _raw_dir(name, root)
    raise ConfigError(
        f"data.data-root={str(root)!r}: dataset {name} not found (expected {raw}/"
        f"{info.raw_files[0]}[.gz]); set data.data-root or FEDAPPS_DATA_ROOT, "
        "or data.download=true on a machine with internet"
    )


def _bundled_csv(file_name: str, delimiter: str | None = None) -> np.ndarray:
    """One of scikit-learn's bundled data files, read as its loaders read it but without
    importing scikit-learn: that import (scipy.stats and more) took 2-4 s in every process of
    a run (ServerApp and each Ray actor), longer than a quick run's training."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded datasets ship with scikit-learn: pip install scikit-learn")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / file_name
    with gzip.open(path, "rt", encoding="utf-8") as text:
        return np.loadtxt(text, delimiter=delimiter)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (the same arrays as `load_digits()`), 0-16 scaled to 0-255."""
    data = _bundled_csv("digits.csv.gz", delimiter=",")
    images = data[:, :-1].reshape(-1, 8, 8)
    x = np.round(images * (255.0 / 16.0)).astype(np.uint8)[:, None, :, :]
    return x, data[:, -1].astype(np.int64)


def _idx_arrays(name: str, root: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """MNIST-family train + test read from their unpacked IDX files without torchvision (the
    same arrays); None for other datasets or when the files are not there (download)."""
    files = DATASETS[name].raw_files
    raw = _raw_dir(name, root)
    if len(files) != 4 or not files[0].endswith("idx3-ubyte") or not _has_files(raw, files):
        return None
    (x1, y1), (x2, y2) = (read_idx_split(raw, *files[:2]), read_idx_split(raw, *files[2:]))
    return np.concatenate([x1, x2]), np.concatenate([y1, y2])


def _torchvision(name: str, root: Path, download: bool) -> tuple[np.ndarray, np.ndarray]:
    arrays = _idx_arrays(name, root)
    if arrays is not None:
        return arrays
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


def _read_torchvision(name: str, root: Path, download: bool
                      ) -> tuple[np.ndarray, np.ndarray, str]:
    """Images, labels and the source identity of a torchvision dataset; a file torchvision
    cannot parse is a one-line ConfigError naming the folder it read (the cache's, if there)."""
    check_available(name, root, download)
    identity = source_identity(name, root)
    tv_root = resolve_root(name, root, identity) or root
    try:
        x, y = _torchvision(name, tv_root, download)
    except (RuntimeError, ValueError, AssertionError, OSError, EOFError) as err:
        where = _raw_dir(name, tv_root)
        fix = (f"delete {where} to unpack it again" if tv_root != root
               else f"put a good copy of {DATASETS[name].folder} there")
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"dataset {name}: cannot read {where} ({type(err).__name__}: "
                          f"{reason}); {fix}") from None
    return x, y, identity


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write atomically (concurrent processes may build the same cache file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def cached_npz(path: Path, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays in `path`, or `make()` saved there atomically first (allow_pickle=False:
    plain arrays only), so concurrent processes never read a half-written file."""
    if path.is_file():
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    arrays = make()
    _save_npz(path, **arrays)
    return arrays


def _save_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    np.save(tmp, array)
    tmp.replace(path)


def pool_files(name: str, identity: str, load: Callable[[], tuple[np.ndarray, np.ndarray]]
               ) -> tuple[np.ndarray, np.ndarray, str]:
    """A torchvision pool as arrays mapped from .npy files in the cache (made once from the
    raw files): a process reads only the pages of the samples it indexes, and every process
    on the machine shares them through the page cache, so a SuperNode or a Ray worker holds
    its own partition rather than a private copy of the whole pool. Returns (x, y, cache id);
    the id is the source files' identity, so other raw files are never served from it."""
    cache_id = f"{name}-{identity}"
    folder = cache_dir() / "pools"
    x_path, y_path = folder / f"{cache_id}-x.npy", folder / f"{cache_id}-y.npy"
    if not (x_path.is_file() and y_path.is_file()):
        x, y = load()
        folder.mkdir(parents=True, exist_ok=True)
        _save_npy(x_path, np.ascontiguousarray(x))
        _save_npy(y_path, y)
    # copy-on-write mapping: writable for torch, never written back to the file
    return np.load(x_path, mmap_mode="c"), np.load(y_path), cache_id


def load_pool(name: str, root: Path, download: bool = False) -> Pool:
    """Load a whole dataset (official train first, then official test); the built-in
    torchvision datasets are mapped from the cache (`pool_files`), not read into memory."""
    info = DATASETS[name]
    if info.loader is not None:
        pool = info.loader(root, download)
        if pool.input_shape != tuple(info.shape) or pool.task != info.task \
                or pool.normalization != info.normalization:
            raise ValueError(f"dataset {name}: loader gave {pool.task}/{pool.normalization} "
                             f"samples of shape {pool.input_shape}, expected {info.task}/"
                             f"{info.normalization} {tuple(info.shape)}")
        return pool
    source = ""
    cache_id = None
    if name == "digits":
        x, y = _digits()
        num_train = DIGITS_NUM_TRAIN
    else:
        check_available(name, root, download)
        if download:  # torchvision fetches the files first
            _read_torchvision(name, root, download)
        identity = source_identity(name, root)
        x, y, cache_id = pool_files(name, identity,
                                    lambda: _read_torchvision(name, root, False)[:2])
        source = identity
        num_train = {"cifar10": 50000, "cifar100": 50000, "emnist": 112800}.get(name, 60000)
    if x.shape[1:] != info.shape:
        raise ValueError(f"dataset {name}: images of shape {x.shape[1:]}, expected {info.shape}")
    return Pool(torch.from_numpy(x), torch.from_numpy(y), num_train, info.num_classes,
                source=source, cache_id=cache_id, mapping=file_mapping(x))
