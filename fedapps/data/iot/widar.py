"""Widar3.0 (Zhang et al. 2021): body-velocity profiles (BVP) of 9 hand gestures, 22x20x20.

Layout: the one the FedAIoT reference downloads (datasets/widar/download.py, loaders/widar.py):
SenseFi's processed copy, `<root>/widar/Widardata/{train,test}/<k>-<gesture>/user<u>-*.csv`,
one sample per file, 22 rows (time steps, already brought to 22 by SenseFi) x 400
columns (the 20x20 velocity bins). Its 22 gesture folders are numbered k = 1..22 (1-Push&Pull,
2-Sweep, ..., 22-Draw-10; docs/DATA.md lists them). Widar3.0's own `.mat` files are not read:
the reference's class list is in SenseFi's numbering (Widar3.0 numbers gestures per date), and
SenseFi's rule for bringing T to 22 steps and its flattening order are not published.

Preprocessing, as the reference does it (the thesis only says "9 gestures performed by more
than 3 users" and "standard scaler"):
- label k - 1; only SELECTED (reference `selected_classes`) is kept, renumbered 0..8 in order;
- standard scaling with SenseFi's global constants, (x - 0.0025) / 0.0119 for every value;
- SenseFi's own train/test folders are merged, and the split is by user: users are ranked by
  their number of samples over all 22 gestures (ascending, ties by user number), ranks
  TRAIN_RANKS train and every other rank tests (reference: `split` = 0..16 minus 0-3 and 15).
The user is each sample's natural client id.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool
from fedapps.data.iot.common import (
    cached_arrays,
    download_zip,
    files_identity,
    google_drive_url,
    missing,
)
from fedapps.errors import ConfigError

NAME = "widar"
FOLDER = "widar"
DRIVE_ID = "14vp4D8W0X2bDLpXnpP-U_VT9PIGkVf_4"  # Widardata.zip, the reference's download.py
# 0-based SenseFi gesture numbers kept: Push&Pull, Slide, Draw-Triangle(H), Draw-N(V), Draw-1,
# Draw-3, Draw-4, Draw-5, Draw-8
SELECTED = (0, 3, 7, 10, 12, 14, 15, 16, 19)
TRAIN_RANKS = frozenset([*range(4, 15), 16])  # user ranks by sample count that train
MEAN, STD = 0.0025, 0.0119  # SenseFi's dataset-wide BVP mean and standard deviation
STEPS, BINS = 22, 20
LAYOUT = f"{FOLDER}/Widardata/{{train,test}}/<k>-<gesture>/user<u>-*.csv (22x400 values each)"
WHERE = (f"SenseFi's processed Widardata.zip (Google Drive file {DRIVE_ID}, linked from "
         "github.com/xyanchen/WiFi-CSI-Sensing-Benchmark; Widar3.0 BVP, CC BY-NC 4.0); "
         "data.download=true fetches it")
GESTURE_DIR = re.compile(r"(\d+)-")
USER_FILE = re.compile(r"user(\d+)-")


def sample_files(root: Path) -> list[Path]:
    return sorted((root / FOLDER / "Widardata").glob("*/*/*.csv"))


def check(root: Path) -> None:
    if not sample_files(root):
        raise missing(NAME, root, LAYOUT, WHERE)


def parse(path: Path) -> tuple[int, int]:
    """(0-based gesture number, user) from `<k>-<gesture>/user<u>-...csv`."""
    gesture, user = GESTURE_DIR.match(path.parent.name), USER_FILE.match(path.name)
    if gesture is None or user is None:
        raise ConfigError(f"dataset {NAME}: {path} does not follow {LAYOUT}")
    return int(gesture.group(1)) - 1, int(user.group(1))


def held_out_users(counts: dict[int, int]) -> set[int]:
    """The users whose rank by sample count (ascending, ties by user number) is not in
    TRAIN_RANKS: for Widar's 17 users, the 4 with the fewest samples and the second largest."""
    order = sorted(counts, key=lambda u: (counts[u], u))
    return {u for rank, u in enumerate(order) if rank not in TRAIN_RANKS}


def read_arrays(files: list[Path]) -> dict[str, np.ndarray]:
    """x float32 [N, 22, 20, 20] scaled, y int64 [N] in 0..8, user [N]; train users first."""
    meta = np.array([parse(f) for f in files], dtype=np.int64).reshape(-1, 2)
    users, counts = np.unique(meta[:, 1], return_counts=True)
    held_out = held_out_users(dict(zip(users.tolist(), counts.tolist(), strict=True)))
    keep = np.flatnonzero(np.isin(meta[:, 0], SELECTED))
    is_test = np.isin(meta[keep, 1], sorted(held_out))
    if not len(keep) or is_test.all():
        raise ConfigError(f"dataset {NAME}: no training user has samples of the kept "
                          f"gestures ({len(users)} users under {FOLDER}/Widardata)")
    keep = np.concatenate([keep[~is_test], keep[is_test]])  # train first, file order within
    x = np.empty((len(keep), STEPS, BINS, BINS), dtype=np.float32)
    for i, k in enumerate(keep):
        try:
            # parsed as float64 and then rounded, as the reference's genfromtxt + float32 does
            values = np.loadtxt(files[k], delimiter=",", dtype=np.float64, ndmin=2)
        except ValueError as err:
            raise ConfigError(f"dataset {NAME}: {files[k]} is no csv of numbers "
                              f"({' '.join(str(err).split())})") from None
        if values.size != STEPS * BINS * BINS:
            raise ConfigError(f"dataset {NAME}: {files[k]} holds {values.shape} values, "
                              f"expected {STEPS}x{BINS * BINS}")
        x[i] = values.reshape(STEPS, BINS, BINS)
    x -= MEAN
    x /= STD
    label = {g: i for i, g in enumerate(SELECTED)}
    y = np.array([label[g] for g in meta[keep, 0].tolist()], dtype=np.int64)
    return {"x": x, "y": y, "user": meta[keep, 1], "num_train": np.array(int((~is_test).sum()))}


def load(root: Path, download: bool) -> Pool:
    """The Widar pool, downloaded first when allowed and missing; cached by the files."""
    if download and not sample_files(root):
        download_zip(google_drive_url(DRIVE_ID), root / FOLDER, "Widardata.zip")
    check(root)
    files = sample_files(root)
    identity = files_identity(files, {"selected": SELECTED, "train_ranks": sorted(TRAIN_RANKS),
                                      "scale": [MEAN, STD]})
    arrays = cached_arrays(NAME, identity, lambda: read_arrays(files))
    return Pool(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]),
                int(arrays["num_train"]), len(SELECTED), normalization="none",
                client_ids=arrays["user"], source=f"{NAME}-{identity}")


DATASETS[NAME] = DatasetInfo(len(SELECTED), (STEPS, BINS, BINS), normalization="none",
                             has_client_ids=True, loader=load, check=check,
                             downloadable=True)
