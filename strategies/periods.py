"""Rounds of P periods with per-client models between them (Fed-Star, RingFed; seed 003).

In each period the participants train in parallel, each from ITS OWN current model (period 1:
the global model; later: its pre-aggregate), then every participant's model is replaced by a
pre-aggregate of all trained models (the subclass says how). After the P-th period's
pre-aggregation the server averages the pre-aggregates by data size (eq. 3.6) or uniformly.

The per-client models between steps are server state (`state_arrays`), so a checkpoint taken
in the middle of a round resumes with the same numbers. The global model does not move until
the round's last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedapps.settings import AlgoSettings, setting
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy, Upload
from strategies.peer import final_weights
from strategies.plan import Assignment, RoundPlan

LOCAL, TRAINED, SIZES = "peer-local-", "peer-trained-", "peer-sizes"


@dataclass(frozen=True)
class PeriodSettings(AlgoSettings):
    """Keys both periodic methods share: periods per round and the server's final weights."""

    periods: int = setting(2, ge=1)  # P (seed 003 Table 5.1: P = 2)
    final_weights: str = setting("data-size", choices=("data-size", "uniform"))


class PeriodicStrategy(BaseStrategy):
    """P periods per round, `STEPS_PER_PERIOD` steps each; step 0 of a period trains."""

    algo: PeriodSettings
    STEPS_PER_PERIOD = 1

    def __init__(self, **kwargs: Any) -> None:  # BaseStrategy's keywords
        super().__init__(**kwargs)
        self.local: dict[int, list[np.ndarray]] = {}  # each client's model for its next period
        self.trained: dict[int, list[np.ndarray]] = {}  # this period's trained models
        self.sizes: dict[int, int] = {}  # training examples per client (final weights)

    def steps_per_round(self, server_round: int) -> int:
        return self.algo.periods * self.STEPS_PER_PERIOD

    def phase(self, step: int) -> tuple[int, int]:
        """(period from 0, step within the period) of a step."""
        return divmod(step, self.STEPS_PER_PERIOD)

    def train_plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        """Every participant trains from its own model: the global one in the first period,
        its pre-aggregate later (a client that dropped out of an earlier period stays out)."""
        period, _ = self.phase(step)
        who = sorted(participants) if period == 0 else sorted(set(participants) & set(self.local))
        expected = self.shared_arrays()
        sent = {pid: self.global_arrays if period == 0 else self.local[pid] for pid in who}
        return self.make_plan(server_round, step, [
            Assignment(pid, sent[pid], expected, facts={"period": period},
                       reference=self.shared_part(sent[pid])) for pid in who])

    def store_trained(self, uploads: list[Upload]) -> None:
        """The snapshot of this period's trained models (and each client's data size)."""
        self.trained = {u.partition_id: self.merge(u.arrays) for u in uploads}
        self.sizes.update({u.partition_id: u.num_examples for u in uploads})

    def end_period(self, plan: RoundPlan, pre_aggregates: dict[int, list[np.ndarray]]
                   ) -> list[np.ndarray]:
        """Keep the pre-aggregates for the next period; after the last one, the server's
        aggregate of them (and no per-client state left in the round-end checkpoint)."""
        self.local, self.trained = pre_aggregates, {}
        if not plan.last_step:
            return self.global_arrays
        weights = final_weights({p: self.sizes[p] for p in self.local}, self.algo.final_weights)
        new = weighted_average([self.local[p] for p in weights], list(weights.values()))
        self.local, self.sizes = {}, {}
        return new

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        state = {f"{LOCAL}{p}": list(a) for p, a in self.local.items()}
        state.update({f"{TRAINED}{p}": list(a) for p, a in self.trained.items()})
        if self.sizes:
            state[SIZES] = [np.array(sorted(self.sizes.items()), dtype=np.int64)]
        return state

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        self.local = {int(k[len(LOCAL):]): list(v) for k, v in state.items()
                      if k.startswith(LOCAL)}
        self.trained = {int(k[len(TRAINED):]): list(v) for k, v in state.items()
                        if k.startswith(TRAINED)}
        self.sizes = {int(p): int(n) for p, n in state[SIZES][0]} if SIZES in state else {}
