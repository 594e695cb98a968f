"""Seeded participant sampling: the same seed and round give the same clients, whatever the
order in which nodes connected, so runs, resumes and deployments repeat."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def sample_clients(seed: int, server_round: int, available: Iterable[int], k: int) -> list[int]:
    """k clients uniformly without replacement, sorted."""
    rng = np.random.default_rng([seed, server_round])
    pool = sorted(available)
    k = min(k, len(pool))
    return sorted(int(p) for p in rng.choice(pool, size=k, replace=False))


def sample_evaluators(seed: int, server_round: int, available: Iterable[int],
                      fraction: float) -> list[int]:
    """All clients (the evaluation contract), or a seeded share of them for large
    federations."""
    pool = sorted(available)
    if fraction >= 1.0:
        return pool
    k = max(1, int(np.ceil(fraction * len(pool))))
    rng = np.random.default_rng([seed, server_round, 1])
    return sorted(int(p) for p in rng.choice(pool, size=k, replace=False))
