"""UT-HAR (Yousefi et al. 2017): Wi-Fi CSI amplitude of 7 activities, windows of 250 packets.

Layout: the one the FedAIoT reference downloads (datasets/ut_har/download.py, loaders/ut_har.py):
SenseFi's processed copy, `<root>/ut-har/UT_HAR/data/X_{train,val,test}.csv` and
`<root>/ut-har/UT_HAR/label/y_{train,val,test}.csv`. Despite the name these are NumPy .npy
files: X [N, 250, 90] (250 packets x the raw csv's columns 2-91, the amplitudes in dB; the
phases, columns 92-181, are not in them), y [N] with classes 0-6 (lie down, fall, walk, pick
up, run, sit down, stand up). SenseFi already cut the recordings into the 250-packet windows
and made the predefined split; the original recordings (`input_*.csv`, `annotation_*.csv`) carry
no split, so they are not read here. Train (3,977) and test (500) are used; val (496) is not
(as in the reference, and as the thesis's Table 2.1 counts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool
from fedapps.data.iot.common import (
    cached_arrays,
    download_zip,
    files_identity,
    google_drive_url,
    require,
)
from fedapps.errors import ConfigError

NAME = "ut-har"
FOLDER = "ut-har"
DRIVE_ID = "1fEiI3nAoOsddR5qcJQXqz4ocM3aMAcwz"  # UT_HAR.zip, the reference's download.py
SPLITS = ("train", "test")
PACKETS, PAIRS, SUBCARRIERS = 250, 3, 30
NUM_CLASSES = 7
LAYOUT = f"{FOLDER}/UT_HAR/{{data/X,label/y}}_{{train,test}}.csv (.npy files despite the name)"
WHERE = (f"SenseFi's processed UT_HAR.zip (Google Drive file {DRIVE_ID}, linked from "
         "github.com/xyanchen/WiFi-CSI-Sensing-Benchmark); data.download=true fetches it")


def split_files(split: str) -> tuple[str, str]:
    """(inputs, labels) of one split, relative to the data root."""
    return (f"{FOLDER}/UT_HAR/data/X_{split}.csv", f"{FOLDER}/UT_HAR/label/y_{split}.csv")


def check(root: Path) -> None:
    require(NAME, root, [f for s in SPLITS for f in split_files(s)], LAYOUT, WHERE)


def _open(path: Path) -> np.ndarray:
    """A memory map of one .npy file (never unpickled); anything else is a one-line error."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as err:
        raise ConfigError(f"dataset {NAME}: {path} is not a NumPy array file "
                          f"({' '.join(str(err).split())})") from None


def read_arrays(root: Path) -> dict[str, np.ndarray]:
    """x float32 [N, 3, 30, 250] (antenna pair, subcarrier, packet), y int64 [N], train first.

    Each split is min-max scaled to [0, 1] with its own global min and max: the thesis is silent
    and the reference (loaders/ut_har.py) does exactly this per file."""
    splits = [tuple(_open(root / f) for f in split_files(s)) for s in SPLITS]
    for s, (x, y) in zip(SPLITS, splits, strict=True):
        if x.ndim != 3 or x.shape[1:] != (PACKETS, PAIRS * SUBCARRIERS) or y.size != len(x) \
                or not len(x):
            raise ConfigError(f"dataset {NAME}: X_{s} has shape {x.shape} and y_{s} {y.shape}, "
                              f"expected [N, {PACKETS}, {PAIRS * SUBCARRIERS}] and [N]")
    sizes = [len(x) for x, _ in splits]
    out = np.empty((sum(sizes), PAIRS, SUBCARRIERS, PACKETS), dtype=np.float32)
    start = 0
    for (x, _), n in zip(splits, sizes, strict=True):
        part = out[start:start + n]
        # the 90 columns are antenna-pair major (Yousefi's Activity_datfile_to_csvfile.m writes
        # each packet's 3x30 amplitudes pair by pair), so [N, 250, 3, 30] -> [N, 3, 30, 250]
        part[...] = x.reshape(n, PACKETS, PAIRS, SUBCARRIERS).transpose(0, 2, 3, 1)
        lo, hi = float(x.min()), float(x.max())
        part -= lo
        part /= max(hi - lo, np.finfo(np.float32).tiny)
        start += n
    labels = np.concatenate([np.asarray(y).reshape(-1) for _, y in splits])
    codes = labels.astype(np.int64)
    if not np.array_equal(codes, labels) or codes.min() < 0 or codes.max() >= NUM_CLASSES:
        raise ConfigError(f"dataset {NAME}: labels must be the class numbers 0-{NUM_CLASSES - 1}")
    return {"x": out, "y": codes, "num_train": np.array(sizes[0])}


def load(root: Path, download: bool) -> Pool:
    """The UT-HAR pool, downloaded first when allowed and missing; cached by the files."""
    if download and not all((root / f).exists() for s in SPLITS for f in split_files(s)):
        download_zip(google_drive_url(DRIVE_ID), root / FOLDER, "UT_HAR.zip")
    check(root)
    files = [root / f for s in SPLITS for f in split_files(s)]
    identity = files_identity(files, {"scale": "min-max per split", "layout": "pair-major"})
    arrays = cached_arrays(NAME, identity, lambda: read_arrays(root))
    return Pool(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]),
                int(arrays["num_train"]), NUM_CLASSES, normalization="none",
                source=f"{NAME}-{identity}")


DATASETS[NAME] = DatasetInfo(NUM_CLASSES, (PAIRS, SUBCARRIERS, PACKETS), normalization="none",
                             loader=load, check=check, downloadable=True)
