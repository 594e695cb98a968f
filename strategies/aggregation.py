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


def split_average(models: Sequence[Sequence[np.ndarray]], is_base: Sequence[bool],
                  base_weights: Sequence[float], head_weights: Sequence[float]
                  ) -> list[np.ndarray]:
    """FedReb/FedReG split aggregation (seed 000 eqs. 3.9-3.10, seed 001 eqs. 4-5): base layers
    averaged with `base_weights` (n_orig), head layers with `head_weights` (n_eff)."""
    by_base = weighted_average(models, base_weights)
    by_head = weighted_average(models, head_weights)
    return [b if base else h for b, h, base in zip(by_base, by_head, is_base, strict=True)]
