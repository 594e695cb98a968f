"""WISDM-W and WISDM-P (seed 004 s.2.1): the 2019 WISDM smartphone and smartwatch activity
release (Weiss 2019, UCI 507), one dataset per device from the same raw layout and code.

Raw layout under the data root (the folder the UCI release unpacks to):
  <root>/wisdm-dataset/raw/{watch,phone}/{accel,gyro}/data_<subject>_<accel|gyro>_<device>.txt
with lines `subject,activity_code,timestamp,x,y,z;`. The subject is the file name's <subject>
(1600-1650), the natural client id.

Preprocessing (thesis s.2.1 and s.2.2.2; [ref] = where the thesis is silent and the FedAIoT
reference, loaders/wisdm.py, decides):
1. A subject's accelerometer and gyroscope rows are joined on equal timestamps (inner join, rows
   in timestamp order) [ref: `dfa.merge(dfg, how='inner', on='timestamp')`]; features are
   accelerometer x, y, z then gyroscope x, y, z.
2. Activities: eating soup, chips, pasta and sandwich (H, I, J, L) become one class "eating";
   kicking, catching and dribbling (M, O, P) are dropped: 12 classes, numbered as the reference
   numbers them [ref: datasets/wisdm/activity_key_filtered.txt].
3. Every feature is standardized, (v - mean) / std over the joined rows [ref: normalize_data],
   with the statistics of the train subjects' rows only (the reference uses every subject's;
   train-only keeps the test subjects out of the inputs, as the project's other sources do).
4. 10 s windows at 20 Hz (200 rows) with 50% overlap (step 100), cut per subject and activity
   code; the first window starts at row 200 [ref: create_dataset's `range(window, len, step)`].
   Per raw code, so no window spans two eating recordings.
5. Split by subject: the 6 subjects in TEST_SUBJECTS are the test split, the other 45 train
   (thesis: 45/6; which 6 is not published, the reference draws them at random per run).
The windows, labels and subjects are cached (`common.cached_arrays`); the pool's
normalization is "none" because the loader has standardized the inputs already.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool
from fedapps.data.iot.common import cached_arrays, download_zip, files_identity, missing
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

FOLDER = "wisdm-dataset"
DEVICES = {"wisdm-w": "watch", "wisdm-p": "phone"}
URL = ("https://archive.ics.uci.edu/static/public/507/"
       "wisdm+smartphone+and+smartwatch+activity+and+biometrics+dataset.zip")
WHERE = (f"UCI 507, the WISDM Smartphone and Smartwatch Activity and Biometrics Dataset "
         f"(Weiss 2019): {URL} (the zip holds wisdm-dataset.zip), or set data.download=true")

CLASSES = ("walking", "jogging", "stairs", "sitting", "standing", "typing", "teeth", "eating",
           "drinking", "writing", "clapping", "folding")
# raw activity code -> class index; codes not listed (M, O, P: the ball activities) are dropped
CODE_TO_CLASS = {"A": 0, "B": 1, "C": 2, "D": 3, "E": 4, "F": 5, "G": 6,
                 "H": 7, "I": 7, "J": 7, "L": 7, "K": 8, "Q": 9, "R": 10, "S": 11}
WINDOW = 200  # 10 s at 20 Hz
STEP = 100  # 50% overlap
FIRST_START = 200  # the reference's first window start (it skips each run's first 10 s)
# sorted(np.random.default_rng(0).choice(range(1600, 1651), 6, replace=False)), numpy 2.4;
# written out so the split never depends on a generator's implementation.
TEST_SUBJECTS = (1602, 1613, 1615, 1624, 1629, 1639)
FORMAT = 1  # bump when the preprocessing changes: it keys the cache
COLUMNS = ("subject", "activity", "timestamp", "x", "y", "z")


def layout(device: str) -> str:
    return f"{FOLDER}/raw/{device}/{{accel,gyro}}/data_<subject>_{{accel,gyro}}_{device}.txt"


def subject_files(name: str, root: Path) -> list[tuple[int, Path, Path]]:
    """(subject, accelerometer file, gyroscope file) for every subject with an accelerometer
    file, sorted by subject; a missing gyroscope partner is a one-line error."""
    device = DEVICES[name]
    raw = root / FOLDER / "raw" / device
    pattern = re.compile(rf"data_(\d+)_accel_{device}\.txt")
    found = []
    for accel in sorted((raw / "accel").glob(f"data_*_accel_{device}.txt")):
        match = pattern.fullmatch(accel.name)
        if match is None:
            continue
        subject = int(match.group(1))
        gyro = raw / "gyro" / f"data_{subject}_gyro_{device}.txt"
        if not gyro.is_file():
            raise ConfigError(f"dataset {name}: {accel} has no gyroscope partner "
                              f"{gyro}; restore the release's {FOLDER}/raw/{device}/gyro")
        found.append((subject, accel, gyro))
    return sorted(found)


def check(name: str, root: Path) -> None:
    """The one-line missing-data error (before any run)."""
    if not subject_files(name, root):
        raise missing(name, root, layout(DEVICES[name]), WHERE)


def fetch(name: str, root: Path) -> None:
    """Download the UCI archive into the data root and unpack the release zip it nests."""
    try:
        download_zip(URL, root)
        inner = root / f"{FOLDER}.zip"
        if not (root / FOLDER).is_dir() and inner.is_file():
            with zipfile.ZipFile(inner) as z:
                z.extractall(root)
    except (OSError, zipfile.BadZipFile) as err:
        raise ConfigError(f"dataset {name}: download of {URL} failed "
                          f"({type(err).__name__}: {err})") from None


def read_sensor(path: Path) -> pd.DataFrame:
    """One raw file as its six columns (the ';' that ends each line is read as a comment);
    rows with a missing field are dropped [ref: dropna]."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    try:
        frame = pd.read_csv(path, header=None, names=list(COLUMNS), comment=";",
                            dtype={"subject": "Int64", "activity": str, "timestamp": "Int64",
                                   "x": np.float64, "y": np.float64, "z": np.float64})
    except (ValueError, pd.errors.ParserError) as err:
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"dataset WISDM: cannot read {path} ({reason})") from None
    frame = frame.dropna()
    return frame.astype({"timestamp": np.int64})


def joined_rows(accel: Path, gyro: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features float32 [n, 6], activity codes [n]) of one subject: accelerometer and
    gyroscope rows with equal timestamps, in timestamp order, kept activities only."""
    acc = read_sensor(accel)
    gyr = read_sensor(gyro)[["timestamp", "x", "y", "z"]]
    rows = acc.merge(gyr, on="timestamp", how="inner", suffixes=("_acc", "_gyro"))
    rows = rows.sort_values("timestamp", kind="stable")
    rows = rows[rows["activity"].isin(list(CODE_TO_CLASS))]
    features = rows[["x_acc", "y_acc", "z_acc", "x_gyro", "y_gyro", "z_gyro"]]
    return features.to_numpy(np.float32), rows["activity"].to_numpy(str)


def window_starts(length: int) -> np.ndarray:
    """Start rows of the windows cut from a run of `length` rows."""
    return np.arange(FIRST_START, length - WINDOW + 1, STEP)


def build(files: list[tuple[int, Path, Path]]) -> dict[str, np.ndarray]:
    """Windows of every subject (train subjects first, each in subject, activity code, start
    order), their classes and subjects, and num_train."""
    runs = []  # (subject, rows of one activity code in timestamp order, class)
    for subject, accel, gyro in sorted(files, key=lambda f: (f[0] in TEST_SUBJECTS, f[0])):
        features, codes = joined_rows(accel, gyro)
        runs += [(subject, features[codes == c], CODE_TO_CLASS[c]) for c in sorted(set(codes))]
    train_rows = [rows for subject, rows, _ in runs if subject not in TEST_SUBJECTS]
    if sum(map(len, train_rows)) < 2:
        raise ConfigError("dataset WISDM: no rows of a train subject (every subject found is "
                          f"one of the test subjects {TEST_SUBJECTS})")
    stacked = np.concatenate(train_rows).astype(np.float64)
    mean, std = stacked.mean(axis=0), np.maximum(stacked.std(axis=0, ddof=1), 1e-6)
    del stacked
    total = sum(len(window_starts(len(rows))) for _, rows, _ in runs)
    x = np.empty((total, WINDOW, 6), dtype=np.float32)
    y = np.empty(total, dtype=np.int64)
    ids = np.empty(total, dtype=np.int64)
    at = 0
    for subject, rows, label in runs:
        starts = window_starts(len(rows))
        n = len(starts)
        x[at:at + n] = (rows[starts[:, None] + np.arange(WINDOW)] - mean) / std
        y[at:at + n] = label
        ids[at:at + n] = subject
        at += n
    num_train = int(np.count_nonzero(~np.isin(ids, TEST_SUBJECTS)))
    return {"x": x, "y": y, "subject": ids, "num_train": np.array(num_train)}


def load(name: str, root: Path, download: bool) -> Pool:
    """The pool of one device: train subjects' windows first, then the test subjects'."""
    device = DEVICES[name]
    if download and not subject_files(name, root):
        fetch(name, root)
    check(name, root)
    files = subject_files(name, root)
    paths = [p for _, accel, gyro in files for p in (accel, gyro)]
    params = {"format": FORMAT, "device": device, "window": WINDOW, "step": STEP,
              "first": FIRST_START, "test": TEST_SUBJECTS, "codes": CODE_TO_CLASS}
    identity = files_identity(paths, params)
    arrays = cached_arrays(name, identity, lambda: build(files))
    num_train = int(arrays["num_train"])
    if num_train == 0:
        raise ConfigError(f"dataset {name}: no window of a train subject under "
                          f"{root / FOLDER} (runs shorter than {FIRST_START + WINDOW} rows)")
    return Pool(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]), num_train,
                len(CLASSES), normalization="none", client_ids=arrays["subject"],
                source=identity)


def _info(name: str) -> DatasetInfo:
    return DatasetInfo(len(CLASSES), (WINDOW, 6), normalization="none", has_client_ids=True,
                       loader=lambda root, download: load(name, root, download),
                       check=lambda root: check(name, root), downloadable=True)


for _name in DEVICES:
    DATASETS[_name] = _info(_name)
