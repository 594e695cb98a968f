"""FedDyn strategy: keeps the server state h and applies the FedDyn correction to the
unweighted mean of the participants' models (alpha = 0.01, DECISIONS)."""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies.aggregation import feddyn_update
from strategies.base import BaseStrategy, Upload
from strategies.plan import RoundPlan


class FedDyn(BaseStrategy):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.h = [np.zeros_like(a, dtype=np.float64) for a in self.global_arrays]

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        theta, self.h = feddyn_update(self.global_arrays, [u.arrays for u in uploads], self.h,
                                      self.algo.alpha, self.num_clients)
        return theta

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        return {"h": self.h}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        self.h = [np.asarray(a, dtype=np.float64) for a in state["h"]]
