"""Fault injection for testing deployments: a node started with
`--node-config "... fault=<kind>"` misbehaves on purpose; several kinds join with '+'
(`fault="scale+eval-inflate"`).

Training (fit) faults: raise (an exception), hang (sleeps `fault-seconds`, default 3600), nan
(NaN weights), shape (a wrongly shaped array), dtype (float64 arrays), count (num_examples =
0), forge-id (claims another partition's id, in evaluation too), inflate (num_examples =
10**12, to take the whole weighted average), scale (weights x 1e6: a huge update).
Evaluation faults: eval-inflate (correct-global = 1000 x n), eval-negative (correct-global =
-n). All from round `fault-from-round` (default 1) on.
Never set `fault` on a real node.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.client import NumPyClient

FIT_FAULTS = ("raise", "hang", "nan", "shape", "dtype", "count", "forge-id", "inflate", "scale")
EVAL_FAULTS = ("eval-inflate", "eval-negative")
FAULTS = FIT_FAULTS + EVAL_FAULTS


def parse_faults(spec: str) -> tuple[str, ...]:
    """'scale+eval-inflate' -> ('scale', 'eval-inflate'); an unknown kind is an error."""
    kinds = tuple(k for k in spec.split("+") if k)
    bad = [k for k in kinds if k not in FAULTS]
    if bad or not kinds:
        raise ValueError(f"node config: fault={spec!r}; allowed: {', '.join(FAULTS)} "
                         "(several joined with '+')")
    return kinds


def forged_id(metrics: dict[str, Any]) -> dict[str, Any]:
    """Another partition's id than the node's own."""
    own = int(metrics["partition-id"])
    return {**metrics, "partition-id": 1 if own == 0 else 0}


class FaultyClient(NumPyClient):
    """Wraps a client; fit and evaluate misbehave as configured, the rest is delegated."""

    def __init__(self, inner: NumPyClient, kind: str, seconds: float = 3600.0,
                 from_round: int = 1) -> None:
        self.kinds = parse_faults(kind)
        self.inner, self.seconds = inner, seconds
        self.from_round = from_round

    def active(self, config: dict[str, Any], kind: str) -> bool:
        return kind in self.kinds and int(config.get("server-round", 1)) >= self.from_round

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        return self.inner.get_properties(config)

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        loss, n, metrics = self.inner.evaluate(parameters, config)
        if self.active(config, "forge-id"):
            metrics = forged_id(metrics)
        if self.active(config, "eval-inflate"):
            metrics = {**metrics, "correct-global": 1000 * n}
        if self.active(config, "eval-negative"):
            metrics = {**metrics, "correct-global": -n}
        return loss, n, metrics

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        if self.active(config, "raise"):
            raise RuntimeError("injected fault: client crashed during fit")
        if self.active(config, "hang"):
            time.sleep(self.seconds)
        arrays, n, metrics = self.inner.fit(parameters, config)
        if self.active(config, "nan"):
            arrays = [np.full_like(a, np.nan) if a.dtype.kind == "f" else a for a in arrays]
        if self.active(config, "shape"):
            arrays = [np.zeros((*a.shape, 2), a.dtype) for a in arrays]
        if self.active(config, "dtype"):
            arrays = [a.astype(np.float64) for a in arrays]
        if self.active(config, "count"):
            n = 0
        if self.active(config, "forge-id"):
            metrics = forged_id(metrics)
        if self.active(config, "inflate"):
            n = 10**12
        if self.active(config, "scale"):
            arrays = [a * np.asarray(1e6, a.dtype) if a.dtype.kind == "f" else a
                      for a in arrays]
        return arrays, n, metrics
