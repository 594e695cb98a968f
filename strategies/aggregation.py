"""Aggregation math as pure NumPy functions (no Flower), so it can be tested exactly."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weighted_average(models: Sequence[Sequence[np.ndarray]], weights: Sequence[float]
                     ) -> list[np.ndarray]:
    """sum_k w_k / sum w * model_k, layer by layer (FedAvg, eq. 3.1 of seed 000).

    Computed in float64 and cast back to each layer's dtype.
    """
    if not models or len(models) != len(weights):
        raise ValueError("need one weight per model and at least one model")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {list(w)}")
    w = w / w.sum()
    out = []
    for layers in zip(*models, strict=True):
        acc = sum(wk * np.asarray(layer, dtype=np.float64) for wk, layer in zip(w, layers,
                                                                                 strict=True))
        out.append(np.asarray(acc).astype(layers[0].dtype, copy=False))
    return out
