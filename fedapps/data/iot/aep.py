"""AEP (FedAIoT, seed 004 s.2.1): UCI Appliances Energy Prediction (dataset 374), a regression
of the appliances' energy use from a house's temperatures, humidities and the airport weather.

Raw layout: `<data root>/aep/energydata_complete.csv`, the UCI file as published (19,735 rows
at 10-minute resolution; `data.download: true` fetches it from `URL`).

The thesis (s.2.2.2) lists the steps but not their order, columns or fit; those follow the
reference loader (FedAIoT `loaders/energy.py`, `load_dataset`), and every statistic is fitted
on the train split only, as there. Each step's reading and source is written where it is done.
The last step of the reference pipeline, a StandardScaler on the inputs, is the pool's
`feature` normalization (train mean/std), and the thesis's "standard scaler on the output" is
the Normalizer's standardization of regression targets (train mean/std): neither is done here,
so nothing is standardized twice.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedapps.data.datasets import DATASETS, DatasetInfo, Pool
from fedapps.data.iot.common import cached_arrays, download_file, files_identity, missing
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

NAME = "aep"
FOLDER = "aep"
FILE = "energydata_complete.csv"
URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/00374/energydata_complete.csv"
WHERE = ("UCI Machine Learning Repository, dataset 374 'Appliances energy prediction' "
         f"({URL})")
COLUMNS = ("date", "Appliances", "lights",
           *(f"{k}{i}" for i in range(1, 10) for k in ("T", "RH_")),
           "T_out", "Press_mm_hg", "RH_out", "Windspeed", "Visibility", "Tdewpoint", "rv1", "rv2")
NUM_FEATURES = 18  # thesis s.2.2.2 and the reference MLP's input size
TEST_FRACTION = 0.2  # reference: train_test_split(test_size=0.2, random_state=42)
SPLIT_SEED = 42
LOG1P_COLUMNS = ("t9", "rv1", "rv2", "windspeed")  # reference ApplyTransformation
VISIBILITY_THRESHOLD = 40  # reference: visibility > 40 -> 1, else 0
CLIP_PERCENTILES = (10, 90)  # thesis + reference HandleOutliers
PCA_COMPONENTS = 3  # reference AddPcaFeatures(number_of_pca_columns=3)
CORRELATION_LIMIT = 0.85  # reference RemoveCorrelatedFeatures
PREPROCESSING = {"version": 1, "test": TEST_FRACTION, "seed": SPLIT_SEED,
                 "log1p": LOG1P_COLUMNS, "visibility": VISIBILITY_THRESHOLD,
                 "clip": CLIP_PERCENTILES, "pca": PCA_COMPONENTS, "corr": CORRELATION_LIMIT}


def check(root: Path) -> None:
    """The one-line error when the CSV is not under the data root."""
    if not (root / FOLDER / FILE).is_file():
        raise missing(NAME, root, f"{FOLDER}/{FILE}", WHERE)


def split_indices(n: int, fraction: float = TEST_FRACTION,
                  seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows) of a random split, row for row scikit-learn's
    `train_test_split(test_size=fraction, random_state=seed)` that the reference uses (its
    ShuffleSplit: one RandomState(seed) permutation, the first ceil(f*n) rows are the test)."""
    n_test = math.ceil(fraction * n)
    n_train = math.floor((1.0 - fraction) * n)
    perm = np.random.RandomState(seed).permutation(n)
    return perm[n_test:n_test + n_train], perm[:n_test]


def read_csv(path: Path) -> pd.DataFrame:
    """The UCI file with its exact header; the date parsed (one-line error otherwise)."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    try:
        df = pd.read_csv(path)
    except (ValueError, OSError) as err:
        raise ConfigError(f"dataset {NAME}: cannot read {path} ({type(err).__name__})") from None
    if tuple(df.columns) != COLUMNS:
        raise ConfigError(f"dataset {NAME}: {path} has columns {','.join(df.columns)[:200]}; "
                          f"expected the UCI header {','.join(COLUMNS[:4])},...,rv2")
    try:
        df["date"] = pd.to_datetime(df["date"], format="%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ConfigError(f"dataset {NAME}: {path}: dates are not YYYY-MM-DD HH:MM:SS") from None
    if df.drop(columns="date").isna().any().any() or (df["Appliances"] <= 0).any():
        raise ConfigError(f"dataset {NAME}: {path} has empty values or an energy <= 0 "
                          "(its logarithm is the target)")
    return df


def pca_fit(train: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, components [k, d]) of an exact PCA of the train rows (the reference's sklearn
    PCA, unwhitened, on unscaled columns); signs fixed so each component's largest-magnitude
    entry is positive (scikit-learn's convention since 1.5; a sign only flips a feature)."""
    mean = train.mean(axis=0)
    _, _, vt = np.linalg.svd(train - mean, full_matrices=False)
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    return mean, comps * signs[:, None]


def correlated_columns(train: np.ndarray) -> np.ndarray:
    """Mask of the columns the reference's RemoveCorrelatedFeatures drops: column i goes when
    |Pearson r| > 0.85 on the train rows with any earlier column j < i (dropped or not). Its
    intent, dropping the one of the pair less correlated with the target, is not what it does:
    both branches of its test drop column i, so the target plays no part (followed here, as
    it is what gave the reference its 18 inputs)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.corrcoef(train, rowvar=False)
    high = np.abs(np.nan_to_num(corr, nan=0.0)) > CORRELATION_LIMIT  # constant column: NaN, kept
    return np.tril(high, k=-1).any(axis=1)


def features(df: pd.DataFrame, train: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Every row's inputs (float64) and their names, all statistics fitted on the `train` rows.
    The reference pipeline's steps in its order (the thesis lists them, unordered)."""
    import pandas as pd  # lazy: keeps pandas out of a ClientApp's imports
    x = df.drop(columns="Appliances")
    x.columns = [c.lower() for c in x.columns]  # reference: lower-cased names
    # 1. thesis "log-transform the temperatures (skew)"; reference: log1p of t9, rv1, rv2 and
    #    windspeed only (the other temperatures are left as they are).
    for c in LOG1P_COLUMNS:
        x[c] = np.log1p(x[c].to_numpy(dtype=np.float64))
    # 2. thesis "binarize visibility"; reference: 1 where visibility > 40, else 0.
    x["visibility"] = (x["visibility"].to_numpy() > VISIBILITY_THRESHOLD).astype(np.float64)
    # 3. thesis "clip outliers to the 10th/90th percentiles"; reference HandleOutliers: every
    #    column (lights, the binary visibility and the date too), train percentiles
    #    (np.percentile, linear); the date as int64 nanoseconds.
    dates = x.pop("date").to_numpy(dtype="datetime64[ns]").astype(np.int64).astype(np.float64)
    cols = list(x.columns) + ["date"]
    raw = np.column_stack([x.to_numpy(dtype=np.float64), dates])
    low, high = np.percentile(raw[train], CLIP_PERCENTILES, axis=0)
    raw = np.clip(raw, low, high)
    clipped = pd.DataFrame(raw, columns=cols)
    # 4. thesis "central-tendency features"; reference AddCentralTendencyFeatures('mean'): row
    #    means of t1..t9 (after steps 1 and 3) and of rh_1..rh_9 (not t_out, rh_out).
    temps = [f"t{i}" for i in range(1, 10)]
    hums = [f"rh_{i}" for i in range(1, 10)]
    clipped["avg_house_temp"] = clipped[temps].mean(axis=1)
    clipped["avg_humidity_percentage"] = clipped[hums].mean(axis=1)
    # 5. thesis "date features"; reference AddDateFeatures: day of month and month of the
    #    (clipped) date, which is then dropped.
    when = pd.DatetimeIndex(np.round(clipped.pop("date").to_numpy()).astype("datetime64[ns]"))
    clipped["day"] = when.day.to_numpy(dtype=np.float64)
    clipped["month"] = when.month.to_numpy(dtype=np.float64)
    # 6. thesis "PCA for reduction"; reference AddPcaFeatures(3): 3 components of the 31
    #    unscaled columns, fitted on the train rows, APPENDED as pca_1..pca_3 (not a reduction).
    names = list(clipped.columns)
    table = clipped.to_numpy(dtype=np.float64)
    mean, comps = pca_fit(table[train], PCA_COMPONENTS)
    table = np.column_stack([table, (table - mean) @ comps.T])
    names += [f"pca_{i}" for i in range(1, PCA_COMPONENTS + 1)]
    # 7. the reduction to 18 inputs; reference RemoveCorrelatedFeatures (train rows).
    keep = ~correlated_columns(table[train])
    # 8. reference StandardScaler (train): the pool's `feature` normalization, not done here.
    return table[:, keep], [n for n, k in zip(names, keep, strict=True) if k]


def preprocess(path: Path) -> dict[str, np.ndarray]:
    """Train rows then test rows (the reference's split order): float32 inputs, the target
    ln(Appliances) (reference: np.log of the target; the thesis only says it is standardized,
    which the Normalizer does) and the kept feature names."""
    df = read_csv(path)
    train, test = split_indices(len(df))
    order = np.concatenate([train, test])
    df = df.iloc[order].reset_index(drop=True)
    x, names = features(df, np.arange(len(train)))
    if x.shape[1] != NUM_FEATURES:
        raise ConfigError(f"dataset {NAME}: the reference's feature steps kept {x.shape[1]} "
                          f"columns of {path} ({', '.join(names)[:200]}), expected "
                          f"{NUM_FEATURES}: is it the UCI file?")
    y = np.log(df["Appliances"].to_numpy(dtype=np.float64))
    return {"x": x.astype(np.float32), "y": y.astype(np.float32),
            "num_train": np.array(len(train)), "names": np.array(names)}


def load(root: Path, download: bool) -> Pool:
    """The AEP pool (cached, keyed by the CSV's name, size and mtime and the step settings)."""
    path = root / FOLDER / FILE
    if not path.is_file() and download:
        try:
            download_file(URL, path)
        except OSError as err:  # URLError included: offline, moved, refused
            raise ConfigError(f"dataset {NAME}: cannot download {URL} ({err}); put the file at "
                              f"{path} by hand") from None
    check(root)
    identity = files_identity([path], PREPROCESSING)
    arrays = cached_arrays(NAME, identity, lambda: preprocess(path))
    return Pool(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"]),
                int(arrays["num_train"]), None, task="regression", normalization="feature",
                source=f"{NAME}-{identity}")


DATASETS[NAME] = DatasetInfo(None, (NUM_FEATURES,), task="regression", normalization="feature",
                             loader=load, check=check, downloadable=True)
