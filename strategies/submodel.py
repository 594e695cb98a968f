"""Partial-training math for model-heterogeneous FL (seed 004 section 1, DECISIONS): which
nodes of each layer a client of capacity beta gets (rolling, static, random), how a sub-model is
cut out of the global arrays, and selective averaging (eq. 3.10). Pure NumPy, no Flower.

A layer's "nodes" are its output channels (conv kernels) or hidden units. Every parameter
array names, per dimension, the width group it is indexed by (or None for a full dimension):
a conv weight [out, in, kh, kw] is (g_out, g_in, None, None), a bias [out] is (g_out,). Layers of
the same width share a group, so residual additions line up and input channels follow the
previous layer's selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SCHEMES = ("rolling", "rolling-backward", "static", "random")


def window_size(width: int, beta: float) -> int:
    """floor(beta * K_i), at least one node."""
    return max(1, int(np.floor(beta * width + 1e-9)))


def rolling_indices(width: int, beta: float, round_index: int,
                    backward: bool = False) -> np.ndarray:
    """FedRolex, eq. 3.4: start j mod K_i, length floor(beta K_i), wrapping around; `backward`
    starts at (-j) mod K_i, the FedRolex code's `torch.roll(arange(K), j)[:n]` (seed 004 A1)."""
    start = (-round_index if backward else round_index) % width
    return (start + np.arange(window_size(width, beta))) % width


def static_indices(width: int, beta: float) -> np.ndarray:
    """HeteroFL, eq. 3.6: the leading floor(beta K_i) nodes."""
    return np.arange(window_size(width, beta))


def random_indices(width: int, beta: float, rng: np.random.Generator) -> np.ndarray:
    """Federated Dropout, eq. 3.5: floor(beta K_i) nodes without replacement (sorted)."""
    return np.sort(rng.choice(width, size=window_size(width, beta), replace=False))


def node_indices(scheme: str, width: int, beta: float, round_index: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The three schemes differ only here (seed 004 Algorithms 3.1-3.3, line 4)."""
    if beta >= 1.0:
        return np.arange(width)
    if scheme in ("rolling", "rolling-backward"):
        return rolling_indices(width, beta, round_index, backward=scheme == "rolling-backward")
    if scheme == "static":
        return static_indices(width, beta)
    if scheme == "random":
        assert rng is not None, "the random scheme needs a generator"
        return random_indices(width, beta, rng)
    raise ValueError(f"unknown scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")


@dataclass(frozen=True)
class ParamSpec:
    """Per dimension of one array: the width group it is indexed by, or None (kept whole)."""

    groups: tuple[str | None, ...]


def group_indices(widths: dict[str, int], scheme: str, beta: float, round_index: int,
                  rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """One index set per width group (shared by every layer of that width)."""
    return {g: node_indices(scheme, k, beta, round_index, rng) for g, k in sorted(widths.items())}


def selector(spec: ParamSpec, index: dict[str, np.ndarray], shape: tuple[int, ...]):
    """Open-mesh index of one array's entries that a sub-model with these index sets holds."""
    return np.ix_(*[index[g] if g is not None else np.arange(n)
                    for g, n in zip(spec.groups, shape, strict=True)])


def extract(global_arrays: Sequence[np.ndarray], specs: Sequence[ParamSpec],
            index: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The sub-model: every array cut down to the selected nodes of its groups."""
    return [np.ascontiguousarray(a[selector(s, index, a.shape)])
            for a, s in zip(global_arrays, specs, strict=True)]


# a client's weight: one for all its arrays, or one per array (a number, or an array of the
# sub-array's shape: one weight per entry, e.g. the FedRolex code's update counts)
Weight = float | Sequence[float | np.ndarray]


def selective_average(global_arrays: Sequence[np.ndarray], specs: Sequence[ParamSpec],
                      uploads: Sequence[tuple[dict[str, np.ndarray], Sequence[np.ndarray], Weight]],
                      class_rows: Sequence[np.ndarray | None] | None = None,
                      class_arrays: frozenset[int] = frozenset()) -> list[np.ndarray]:
    """Eq. 3.10: each global entry becomes the (weighted) mean over the clients whose sub-model
    holds it; entries no client held this round keep their value. A client's weight is one
    number or one per array (see `Weight`). With `class_rows` (per
    upload, a boolean mask over the classes, or None for all), the rows of the arrays in
    `class_arrays` (the classifier's weight and bias, first dimension = class) count only for
    the clients that hold the class: the HeteroFL/FedRolex code's `label_split`."""
    out = []
    for i, (g, spec) in enumerate(zip(global_arrays, specs, strict=True)):
        total = np.zeros(g.shape, dtype=np.float64)
        weight = np.zeros(g.shape, dtype=np.float64)
        for u, (index, arrays, weights) in enumerate(uploads):
            w = weights[i] if isinstance(weights, Sequence) else weights
            sel = selector(spec, index, g.shape)
            rows = None if class_rows is None or i not in class_arrays else class_rows[u]
            held = np.ones(g.shape, dtype=np.float64) if rows is None else np.broadcast_to(
                np.asarray(rows, dtype=np.float64).reshape(-1, *([1] * (g.ndim - 1))), g.shape)
            total[sel] += w * held[sel] * np.asarray(arrays[i], dtype=np.float64)
            weight[sel] += w * held[sel]
        merged = np.where(weight > 0, total / np.maximum(weight, 1e-300), g)
        out.append(merged.astype(g.dtype))
    return out
