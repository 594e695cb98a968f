"""FedProx strategy: FedAvg aggregation; mu lives on the server and goes down in the fit config.

With `algo.mu-mode` auto, mu follows the FedProx paper's heuristic (Li et al. 2020, Fig. 3
caption) on the round's sample-weighted mean of the clients' training loss (the data term,
without the proximal term, which would otherwise rise with mu and feed back into it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import Scalar

from strategies.base import BaseStrategy, Upload
from strategies.plan import RoundPlan

STATE = "fedprox_mu"  # checkpoint name: [mu, last loss (nan: none yet), consecutive decreases]


@dataclass(frozen=True)
class MuState:
    mu: float
    last_loss: float = math.nan  # nan until the first round's loss
    decreases: int = 0  # consecutive rounds whose loss fell


def next_mu(state: MuState, loss: float, step: float = 0.1, patience: int = 5) -> MuState:
    """One round of the heuristic: a rise adds `step`; `patience` consecutive falls subtract
    it (not below 0) and restart the count; an equal loss breaks the run of falls."""
    if math.isnan(state.last_loss):
        return MuState(state.mu, loss, 0)
    if loss > state.last_loss:
        return MuState(state.mu + step, loss, 0)
    if loss < state.last_loss:
        if state.decreases + 1 >= patience:
            return MuState(max(0.0, state.mu - step), loss, 0)
        return MuState(state.mu, loss, state.decreases + 1)
    return MuState(state.mu, loss, 0)


class FedProx(BaseStrategy):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mu_state = MuState(float(self.algo.mu))

    @property
    def auto(self) -> bool:
        return self.algo.mu_mode == "auto"

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        plan = super().plan(server_round, step, participants)
        for a in plan.assignments:
            a.config["mu"] = self.mu_state.mu
        return plan

    def validate_metrics(self, metrics: dict[str, Scalar]) -> str | None:
        loss = metrics.get("task-loss")
        if self.auto and (isinstance(loss, bool) or not isinstance(loss, int | float)
                          or not math.isfinite(loss)):
            return f"task-loss={loss!r} must be a finite number (algo.mu-mode auto)"
        return None

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        new = super().aggregate(plan, uploads)
        if self.auto and plan.last_step:
            n = np.array([u.num_examples for u in uploads], dtype=np.float64)
            losses = np.array([float(u.metrics["task-loss"]) for u in uploads])
            self.mu_state = next_mu(self.mu_state, float(np.sum(n * losses) / n.sum()))
        return new

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        s = self.mu_state
        return {STATE: [np.array([s.mu, s.last_loss, s.decreases], dtype=np.float64)]}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        if STATE in state:
            mu, last, decreases = (float(v) for v in state[STATE][0])
            self.mu_state = MuState(mu, last, int(decreases))
