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


def nova_normalizer(tau: int, momentum: float = 0.0) -> float:
    """FedNova's a_i for tau local SGD steps with heavy-ball momentum rho (Wang et al. 2020,
    Sec. 5; the authors' optimizer accumulates it step by step).

    Why: with momentum, gradient t moves the model by lr * (1 + rho + ... + rho^(tau-t)), so
    w_start - w_i = lr * sum_t c_t g_t with c_t = rho c_{t-1} + 1; a_i = sum_t c_t (= tau for
    plain SGD) is the total weight that FedNova divides out."""
    if tau < 0 or not 0.0 <= momentum < 1.0:
        raise ValueError(f"need tau >= 0 and 0 <= momentum < 1, got {tau}, {momentum}")
    counter, total = 0.0, 0.0
    for _ in range(tau):
        counter = counter * momentum + 1.0
        total += counter
    return total


def fednova_update(start: Sequence[np.ndarray], models: Sequence[Sequence[np.ndarray]],
                   weights: Sequence[float], normalizers: Sequence[float],
                   normalized: Sequence[bool] | None = None,
                   momentum_buffer: Sequence[np.ndarray] | None = None, gmf: float = 0.0,
                   lr: float = 1.0) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """FedNova server step (Wang et al. 2020, eq. 6): d_i = (w - w_i) / a_i,
    tau_eff = sum_i p_i a_i, w <- w - tau_eff sum_i p_i d_i, p_i = n_i / n.

    Clients upload their models (so the upload check and FedAvg's code path stay unchanged);
    the server forms d_i in float64. Equal a_i give FedAvg exactly (up to float rounding).
    Arrays with `normalized` False (BatchNorm running statistics, counters: not moved by
    gradient steps) are sample-weighted averages. With gmf > 0 the authors' global momentum:
    v <- gmf v + step / lr, w <- w - lr v (v in gradient units, so a changing lr is handled
    as in their code); returns (new arrays, new buffer or None when gmf is 0)."""
    a = np.asarray(normalizers, dtype=np.float64)
    if len(a) != len(models) or np.any(~np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"need one finite normalizer > 0 per model, got {list(a)}")
    if gmf > 0 and lr <= 0:
        raise ValueError(f"global momentum needs lr > 0, got {lr}")
    averaged = weighted_average(models, weights)  # validates the weights
    p = np.asarray(weights, dtype=np.float64)
    p = p / p.sum()
    tau_eff = float(np.sum(p * a))
    mask = [True] * len(start) if normalized is None else list(normalized)
    new, buffer = [], []
    for i, w in enumerate(start):
        if not mask[i] or np.asarray(w).dtype.kind != "f":
            new.append(averaged[i])
            buffer.append(np.zeros(np.shape(w)))
            continue
        w64 = np.asarray(w, dtype=np.float64)
        d = sum(pk / ak * (w64 - np.asarray(m[i], dtype=np.float64))
                for pk, ak, m in zip(p, a, models, strict=True))
        step = tau_eff * d
        if gmf > 0:
            prev = 0.0 if momentum_buffer is None else np.asarray(momentum_buffer[i])
            v = gmf * prev + step / lr
            buffer.append(v)
            step = lr * v
        new.append(np.asarray(w64 - step).astype(w.dtype, copy=False))
    return new, (buffer if gmf > 0 else None)
