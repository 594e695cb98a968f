"""FedNova strategy (Wang et al. 2020): normalized averaging of the clients' models by their
local work a_i (reported with tau_i), with the authors' optional global momentum (gmf)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import numpy as np
from flwr.common import Scalar

from strategies.aggregation import fednova_update
from strategies.base import BaseStrategy, Upload
from strategies.plan import RoundPlan

BUFFER = "fednova_momentum"  # checkpoint name of the global momentum buffer


class FedNova(BaseStrategy):
    def __init__(self, *, parameter_names: Collection[str] | None = None, **kwargs: Any
                 ) -> None:
        """`parameter_names`: the model's trainable parameters; the other state entries
        (BatchNorm statistics) are averaged as in FedAvg. None: every float array."""
        super().__init__(**kwargs)
        names = self.array_names
        self.normalized = [parameter_names is None or n in parameter_names for n in names]
        self.buffer: list[np.ndarray] | None = None  # gradient units, as the authors' code

    def validate_metrics(self, metrics: dict[str, Scalar]) -> str | None:
        tau, a = metrics.get("local-steps"), metrics.get("normalizer")
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 1:
            return f"local-steps={tau!r} must be an integer >= 1"
        if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) \
                or a <= 0:
            return f"normalizer={a!r} must be a finite number > 0"
        lr = metrics.get("lr")
        if self.algo.gmf > 0 and (not isinstance(lr, int | float) or not lr > 0):
            return f"lr={lr!r} must be a number > 0 (global momentum)"
        return None

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        mask = [m for m, s in zip(self.normalized, self.shared_mask(), strict=True) if s]
        new, buffer = fednova_update(
            self.shared_arrays(), [u.arrays for u in uploads], [u.num_examples for u in uploads],
            [float(u.metrics["normalizer"]) for u in uploads], mask, self.buffer,
            gmf=self.algo.gmf, lr=float(uploads[0].metrics.get("lr", 1.0)))
        self.buffer = buffer
        return self.merge(new)

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        return {BUFFER: self.buffer} if self.buffer is not None else {}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        if BUFFER in state:
            self.buffer = [np.asarray(a, dtype=np.float64) for a in state[BUFFER]]
