"""Label noise on the clients' train splits: the `label-noise` transform.

Two choices, each with two settings (the test split is never touched):

- which samples: `p` (seed 002, the original behaviour) flips each train label with
  probability p; `ratio` epsilon (seed 004 FedAIoT, B9) flips exactly round(epsilon * n_train)
  labels of every client (half up), a seeded sample without replacement: the selection is per
  client, so every client has the ratio the table row names.
- the new label: uniformly another class (`matrix: null`), or drawn from the row Q[y] of a
  confusion matrix estimated with a centrally trained model (`matrix`: a CSV of Q, as
  `fedapps centralized` writes it) with the true label left out and the rest renormalized, as
  the FedAIoT reference forces a different label; a row with no off-diagonal mass (the central
  model got that class always right) falls back to uniform over the other classes.

`row-max-below` (default null: off) keeps the reference's shortcut of selecting only samples
whose class row has max(Q[y]) below the threshold (it uses 0.95): it is off by default because
the thesis selects "the needed number of samples" at random, and the shortcut flips fewer than
epsilon * n labels on a client whose classes the central model gets right, so epsilon would no
longer be the erroneous-label ratio the table names. With it on, a client with fewer eligible
samples than round(epsilon * n) has all of them flipped (as the reference).

Each client's draws come from the transform's generator, seeded by (seed, partition id,
position). `ratio: null, matrix: null` is exactly the original code path (same numbers).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedapps.data.params import Param
from fedapps.data.rebalance import round_half_up
from fedapps.errors import ConfigError

if TYPE_CHECKING:
    from fedapps.data import ClientData, DatasetInfo
    from fedapps.data.transforms import TransformContext

PARAMS = (
    Param("p", "data.label-noise.p", float, 0.1, low=0, high=1,
          doc="probability that a train label is replaced (when ratio is null)"),
    Param("ratio", "data.label-noise.ratio", float, None, low=0, high=1, nullable=True,
          doc="exact share of each client's train labels replaced (replaces p)"),
    Param("matrix", "data.label-noise.matrix", str, None, nullable=True,
          doc="CSV of the confusion matrix Q the new labels are drawn from"),
    Param("row_max_below", "data.label-noise.row-max-below", float, None, low=0, high=1,
          low_open=True, nullable=True,
          doc="select only samples whose class row has max(Q[y]) below this (reference: 0.95)"),
)

ROW_SUM_TOL = 1e-6  # rows of Q written with 10 significant digits sum to 1 within this
MAKE_Q = ("`fedapps centralized EXPERIMENT --set dataset=DATASET` writes one as "
          "<run dir>/confusion.csv")


def load_matrix(path: str, num_classes: int) -> np.ndarray:
    """Q from its CSV (plain numbers, np.loadtxt: never unpickled), checked: C x C for the
    dataset's C classes, finite, >= 0, every row summing to 1. One-line ConfigError naming
    the key, the file and the command that makes one."""
    key = f"data.label-noise.matrix={path!r}"
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}: no such file; {MAKE_Q}")
    try:
        q = np.loadtxt(file, delimiter=",", dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ConfigError(f"{key}: not a CSV of numbers ({' '.join(str(err).split())}); "
                          f"{MAKE_Q}") from None
    if q.shape != (num_classes, num_classes):
        raise ConfigError(f"{key}: shape {q.shape[0]}x{q.shape[1]}, the dataset has "
                          f"{num_classes} classes ({num_classes}x{num_classes}); {MAKE_Q}")
    if not np.isfinite(q).all() or (q < 0).any():
        raise ConfigError(f"{key}: entries must be finite and >= 0; {MAKE_Q}")
    sums = q.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1) > ROW_SUM_TOL)
    if bad.size:
        raise ConfigError(f"{key}: row {bad[0]} sums to {sums[bad[0]]:.6g}, not 1 (Q_ij = "
                          f"share of true class i predicted as j); {MAKE_Q}")
    return q


def check_params(params: dict[str, Any], info: DatasetInfo, check_files: bool = True) -> None:
    """The settings that need each other or the dataset (run at validation); the matrix file
    is read only with `check_files` (validation without data, e.g. of a grid's cells, skips
    it as it skips the dataset's own files)."""
    if params["matrix"] is not None:
        if not check_files:
            return
        load_matrix(params["matrix"], int(info.num_classes or 0))
    elif params["row_max_below"] is not None:
        raise ConfigError(f"data.label-noise.row-max-below={params['row_max_below']!r}: "
                          "needs data.label-noise.matrix (it reads the rows of Q)")


def redraw(y: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A new label for each y from Q[y] with Q[y, y] set to 0 and the row renormalized
    (uniform over the other classes where nothing is left). Vectorized inverse CDF with u
    scaled to each row's total, so the chosen class always has positive weight: never y."""
    weights = q[y].astype(np.float64, copy=True)
    rows = np.arange(len(y))
    weights[rows, y] = 0.0
    empty = weights.sum(axis=1) <= 0
    weights[empty] = 1.0
    weights[rows[empty], y[empty]] = 0.0
    cum = np.cumsum(weights, axis=1)
    u = rng.random(len(y)) * cum[:, -1]
    return np.argmax(cum > u[:, None], axis=1).astype(y.dtype)


def flip_count(ratio: float, n: int) -> int:
    """round(ratio * n), half up (the reference truncates: int(n * ratio))."""
    return min(n, round_half_up(ratio * n))


def transform(ctx: TransformContext, data: ClientData) -> ClientData:
    """Replace train labels (see the module docstring); extra `label_noise_mask` marks them."""
    k = int(ctx.fd.pool.num_classes or 0)
    y = data.y_train.cpu().numpy()
    rng = ctx.rng()
    p = ctx.params
    if p["ratio"] is None and p["matrix"] is None:  # the original code path, same numbers
        flip = rng.random(len(y)) < p["p"]
        shift = rng.integers(1, k, size=len(y))  # 1..k-1: never the same class
        noisy = np.where(flip, (y + shift) % k, y).astype(y.dtype)
    else:
        q = load_matrix(p["matrix"], k) if p["matrix"] is not None else np.ones((k, k))
        if p["ratio"] is None:
            flip = rng.random(len(y)) < p["p"]
        else:
            eligible = np.arange(len(y))
            if p["row_max_below"] is not None:
                eligible = eligible[q.max(axis=1)[y] < p["row_max_below"]]
            chosen = rng.choice(eligible, size=min(flip_count(p["ratio"], len(y)),
                                                   len(eligible)), replace=False)
            flip = np.zeros(len(y), dtype=bool)
            flip[chosen] = True
        noisy = y.copy()
        noisy[flip] = redraw(y[flip], q, rng)
    return data.replace(y_train=torch.from_numpy(noisy).to(data.y_train.device),
                        extras={"label_noise_mask": torch.from_numpy(flip)})
