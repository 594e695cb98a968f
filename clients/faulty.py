"""Fault injection for testing deployments: a node started with
`--node-config "... fault=<kind>"` answers fit with a deliberate failure.

Kinds: raise (an exception), hang (sleeps `fault-seconds`, default 3600), nan (NaN weights),
shape (a wrongly shaped array), dtype (float64 arrays), count (num_examples = 0); from round
`fault-from-round` (default 1) on.
Never set `fault` on a real node.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.client import NumPyClient

FAULTS = ("raise", "hang", "nan", "shape", "dtype", "count")


class FaultyClient(NumPyClient):
    """Wraps a client; fit misbehaves as configured, everything else is delegated."""

    def __init__(self, inner: NumPyClient, kind: str, seconds: float = 3600.0,
                 from_round: int = 1) -> None:
        if kind not in FAULTS:
            raise ValueError(f"node config: fault={kind!r}; allowed: {', '.join(FAULTS)}")
        self.inner, self.kind, self.seconds = inner, kind, seconds
        self.from_round = from_round

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        return self.inner.get_properties(config)

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        return self.inner.evaluate(parameters, config)

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        if int(config.get("server-round", 1)) < self.from_round:
            return self.inner.fit(parameters, config)
        if self.kind == "raise":
            raise RuntimeError("injected fault: client crashed during fit")
        if self.kind == "hang":
            time.sleep(self.seconds)
        arrays, n, metrics = self.inner.fit(parameters, config)
        if self.kind == "nan":
            arrays = [np.full_like(a, np.nan) if a.dtype.kind == "f" else a for a in arrays]
        elif self.kind == "shape":
            arrays = [np.zeros((*a.shape, 2), a.dtype) for a in arrays]
        elif self.kind == "dtype":
            arrays = [a.astype(np.float64) for a in arrays]
        elif self.kind == "count":
            n = 0
        return arrays, n, metrics
