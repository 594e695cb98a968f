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


def feddyn_update(previous: Sequence[np.ndarray], models: Sequence[Sequence[np.ndarray]],
                  h: Sequence[np.ndarray], alpha: float, num_clients: int
                  ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """FedDyn server step (Acar et al. 2021, Alg. 1):
    h <- h - alpha / m * sum_k (theta_k - theta_prev);  theta <- mean_k theta_k - h / alpha."""
    new_h, new_theta = [], []
    for i, prev in enumerate(previous):
        prev64 = np.asarray(prev, dtype=np.float64)
        drift = sum(np.asarray(m[i], dtype=np.float64) - prev64 for m in models)
        h_i = np.asarray(h[i], dtype=np.float64) - alpha / num_clients * drift
        mean = sum(np.asarray(m[i], dtype=np.float64) for m in models) / len(models)
        new_h.append(h_i)
        new_theta.append((mean - h_i / alpha).astype(prev.dtype))
    return new_theta, new_h
