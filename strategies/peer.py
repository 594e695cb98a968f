"""Peer pre-aggregation math as pure NumPy (no Flower), shared by Fed-Star and RingFed.

Both algorithms replace every participant's trained model by a convex combination of the
participants' trained models, computed from a snapshot of ALL of them (seed 003 s.7 item 7: never
in place, so no client mixes in a model that was already pre-aggregated this period). A "row"
is the combination one client uses: {source partition id: weight}, weights summing to 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from strategies.aggregation import weighted_average

Row = dict[int, float]
EPS = 1e-12  # a weight sum at or below this counts as zero (all peers scored 100%)


def star_row(peers: Sequence[int], scores: Sequence[float], own: int,
             exclude_self: bool = False) -> Row:
    """Fed-Star weights of client `own` (seed 003 eqs. 3.8-3.9): M(k, j) = 1 - acc_k(j) with
    accuracy in [0, 1] (the thesis's acc/100), normalized over j.

    A model that does badly on k's training split gets more weight (the thesis's intent: learn
    the others' outlier features). Own model included unless `exclude_self`. When every
    included M is zero (all scores 1.0) the weights are uniform over the included models
    instead of dividing by zero (DECISIONS' epsilon); with `exclude_self` and no other peer
    the client keeps its own model."""
    if len(peers) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(peers)} peer models")
    m = np.clip(1.0 - np.asarray(scores, dtype=np.float64), 0.0, None)
    include = np.array([not (exclude_self and p == own) for p in peers])
    if not include.any():
        return {own: 1.0}
    m = np.where(include, m, 0.0)
    total = float(m.sum())
    w = m / total if total > EPS else include / include.sum()
    return {int(p): float(x) for p, x in zip(peers, w, strict=True)}


def ring_rows(order: Sequence[int], gamma: float) -> dict[int, Row]:
    """RingFed pre-aggregation on a ring (strategies/ringfed.py for the reading): client
    order[i] keeps (1 - gamma) of its own trained model and takes gamma of its predecessor's,
    order[i - 1] (cyclic). One client alone keeps its model."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma} must be in [0, 1]")
    rows: dict[int, Row] = {}
    for i, pid in enumerate(order):
        prev = order[i - 1]
        rows[pid] = {pid: 1.0} if prev == pid else {pid: 1.0 - gamma, prev: gamma}
    return rows


def mix(models: Mapping[int, Sequence[np.ndarray]], row: Row) -> list[np.ndarray]:
    """sum_j row[j] * models[j], layer by layer (float64, cast back), from the snapshot."""
    sources = [p for p in row if row[p] > 0.0]
    return weighted_average([models[p] for p in sources], [row[p] for p in sources])


def pre_aggregate(models: Mapping[int, Sequence[np.ndarray]], rows: Mapping[int, Row]
                  ) -> dict[int, list[np.ndarray]]:
    """Every client's pre-aggregate from one snapshot of all trained models; a client without
    a row (e.g. it did not answer the cross-evaluation) keeps its trained model."""
    return {pid: mix(models, rows.get(pid, {pid: 1.0})) for pid in sorted(models)}


def final_weights(sizes: Mapping[int, int], mode: str = "data-size") -> dict[int, float]:
    """Server aggregation of the pre-aggregated models: |D_k| / |D| (seed 003 eq. 3.6, not the
    printed (1/K) sum |D_k|/|D| w_k whose weights sum to 1/K) or uniform 1/K."""
    if mode not in ("data-size", "uniform"):
        raise ValueError(f"mode {mode!r}: allowed: data-size, uniform")
    total = sum(sizes.values()) if mode == "data-size" else len(sizes)
    return {p: (n if mode == "data-size" else 1) / total for p, n in sorted(sizes.items())}
