"""Rounds of P periods with per-client models between them (Fed-Star, RingFed; seed 003).

In each period the participants train in parallel, each from ITS OWN current model (period 1:
the global model; later: its pre-aggregate), then every participant's model is replaced by a
pre-aggregate of all trained models (the subclass says how). After the P-th period's
pre-aggregation the server averages the pre-aggregates by data size (eq. 3.6) or uniformly.

`exchange: trainable` (default) leaves frozen parameters (the VGG-19 transfer model's conv
layers, seed 003 s.7 item 11) out of every message: they never change and every process builds
them identically, so only the trainable part is trained-on, mixed, aggregated and counted in
the traffic (for a model without frozen parameters it is the whole model). `personal:
pre-aggregate` (default) evaluates P with each client's last pre-aggregate and G with the
global model, so both readings of seed 003 Table 5.8 are reported (s.7 item 10: "report
both"; the per-source check in s.5 matches G); `global` gives P = G.

The per-client models between steps are server state (`state_arrays`), so a checkpoint taken
in the middle of a round resumes with the same numbers. The global model does not move until
the round's last step.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedapps.settings import AlgoSettings, setting
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy, Upload
from strategies.peer import final_weights
from strategies.plan import Assignment, RoundPlan

LOCAL, TRAINED, SIZES = "peer-local-", "peer-trained-", "peer-sizes"
PERSONAL = "peer-personal-"  # each client's last pre-aggregate (its P model), kept across rounds


@dataclass(frozen=True)
class PeriodSettings(AlgoSettings):
    """Keys both periodic methods share: periods per round and the server's final weights."""

    periods: int = setting(2, ge=1)  # P (seed 003 Table 5.1: P = 2)
    final_weights: str = setting("data-size", choices=("data-size", "uniform"))
    exchange: str = setting("trainable", choices=("trainable", "all"))  # frozen arrays travel?
    personal: str = setting("pre-aggregate", choices=("pre-aggregate", "global"))  # P model


class PeriodicStrategy(BaseStrategy):
    """P periods per round, `STEPS_PER_PERIOD` steps each; step 0 of a period trains."""

    algo: PeriodSettings
    STEPS_PER_PERIOD = 1

    def __init__(self, frozen: Collection[str] = (), **kwargs: Any) -> None:
        """`frozen`: names of the model's frozen parameters (registry: models.frozen_names);
        the rest are BaseStrategy's keywords. Per-client models hold the exchanged arrays."""
        super().__init__(**kwargs)
        self.frozen = set(frozen) if self.algo.exchange == "trainable" else set()
        self.local: dict[int, list[np.ndarray]] = {}  # each client's model for its next period
        self.trained: dict[int, list[np.ndarray]] = {}  # this period's trained models
        self.sizes: dict[int, int] = {}  # training examples per client (final weights)
        self.personal: dict[int, list[np.ndarray]] = {}  # last pre-aggregates (personal P)

    def shared_mask(self) -> list[bool]:
        """The exchanged arrays: all but the frozen parameters (exchange: trainable)."""
        return [shared and name not in self.frozen
                for name, shared in zip(self.array_names, super().shared_mask(), strict=True)]

    def eval_arrays(self, server_round: int, partition_id: int) -> list[np.ndarray]:
        """The exchanged global arrays, then (personal: pre-aggregate) the client's last
        pre-aggregate, or the global ones again for a client that has none yet."""
        shared = self.shared_arrays()
        if self.algo.personal == "global":
            return shared
        return shared + self.personal.get(partition_id, shared)

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
        start = self.shared_arrays()  # one list: serialized once for every client
        sent = {pid: start if period == 0 else self.local[pid] for pid in who}
        return self.make_plan(server_round, step, [
            Assignment(pid, sent[pid], start, facts={"period": period}, reference=sent[pid])
            for pid in who])

    def store_trained(self, uploads: list[Upload]) -> None:
        """The snapshot of this period's trained models (and each client's data size)."""
        self.trained = {u.partition_id: list(u.arrays) for u in uploads}
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
        if self.algo.personal == "pre-aggregate":
            self.personal.update(self.local)
        self.local, self.sizes = {}, {}
        return self.merge(new)

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        state = {f"{LOCAL}{p}": list(a) for p, a in self.local.items()}
        state.update({f"{TRAINED}{p}": list(a) for p, a in self.trained.items()})
        state.update({f"{PERSONAL}{p}": list(a) for p, a in self.personal.items()})
        if self.sizes:
            state[SIZES] = [np.array(sorted(self.sizes.items()), dtype=np.int64)]
        return state

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        self.local = {int(k[len(LOCAL):]): list(v) for k, v in state.items()
                      if k.startswith(LOCAL)}
        self.trained = {int(k[len(TRAINED):]): list(v) for k, v in state.items()
                        if k.startswith(TRAINED)}
        self.personal = {int(k[len(PERSONAL):]): list(v) for k, v in state.items()
                         if k.startswith(PERSONAL)}
        self.sizes = {int(p): int(n) for p, n in state[SIZES][0]} if SIZES in state else {}
