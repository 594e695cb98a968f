"""What every IoT loader shares: the missing-data error, a cache keyed by the raw files, and
an optional download of a public archive."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedapps.data.datasets import cache_dir, cached_npz
from fedapps.errors import ConfigError


def missing(name: str, root: Path, layout: str, where: str) -> ConfigError:
    """The one-line error for a dataset that is not under the data root."""
    return ConfigError(f"data.data-root={str(root)!r}: dataset {name} not found (expected "
                       f"{root}/{layout}); get it from {where}")


def require(name: str, root: Path, paths: Iterable[str], layout: str, where: str) -> None:
    """Raise `missing(...)` unless every path (relative to the data root) exists."""
    if not all((root / p).exists() for p in paths):
        raise missing(name, root, layout, where)


def files_identity(files: Iterable[Path], extra: object = None) -> str:
    """Names, sizes and mtimes of the raw files (plus any preprocessing parameters): a copy
    that changes on disk, or a change of parameters, never meets arrays cached for another."""
    listing = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(files)]
    blob = json.dumps([listing, extra], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_arrays(name: str, identity: str,
                  make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`make()` once per identity, then read back from `<cache>/iot/<name>-<identity>.npz`
    (allow_pickle=False: only plain arrays, never objects)."""
    return cached_npz(cache_dir() / "iot" / f"{name}-{identity}.npz", make)


def download_file(url: str, path: Path) -> None:
    """Fetch one public file to `path` (only with data.download=true); written under a
    temporary name first, so an interrupted download never looks like the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
        shutil.copyfileobj(response, out)
    tmp.replace(path)


def google_drive_url(file_id: str) -> str:
    """The direct-download address of a public Google Drive file (the reference's download
    scripts fetch with gdown by file id); `confirm=t` skips the large-file warning page."""
    return f"https://drive.usercontent.google.com/download?id={file_id}&export=download&confirm=t"


def download_zip(url: str, dest: Path, archive_name: str | None = None) -> None:
    """Fetch a public zip archive and unpack it into `dest` (only with data.download=true);
    `archive_name` names the saved archive when the URL's last part is no file name. A failed
    fetch or a reply that is no zip archive is a one-line ConfigError."""
    archive = dest / (archive_name or Path(url).name)
    try:
        download_file(url, archive)
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    except (OSError, zipfile.BadZipFile) as err:
        raise ConfigError(f"data.download: fetching {url} into {dest} failed "
                          f"({' '.join(str(err).split())})") from None


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`.lock: processes that start together (SuperNodes, Ray
    workers) wait for the one building the features instead of each building them again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_memmap(path: Path, dtype: type, shape: tuple[int, ...],
                 fill: Callable[[np.ndarray], None]) -> None:
    """A .npy file at `path` written through a memory map by `fill(array)`, atomically: under a
    temporary name first (removed if `fill` fails), so a half-written file is never read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    try:
        fill(out)
        out.flush()
    except BaseException:
        del out
        tmp.unlink(missing_ok=True)
        raise
    del out
    tmp.replace(path)
