"""Fed-Star (seed 003 Algorithm 2 with section 7's decisions): P periods per round, each two
steps: (a) the participants train in parallel, each from its own model; (b) every participant
scores every participant's trained model on its own training split (the cross-evaluation task,
through the server) and is re-initialized from its pre-aggregate sum_j M(k,j)/sum_j M(k,j) w_j,
M(k,j) = 1 - acc_k(j) (eqs. 3.8-3.9), computed from the snapshot of all trained models. After
the P-th pre-aggregation the server averages the pre-aggregates by data size (eq. 3.6).

Decisions (seed 003 s.7 items 4-9, DECISIONS): P training periods per round (the prose, not the
pseudo-code's p in 1..P-1), pre-aggregation after every period including the last, own model
included (`exclude-self` to drop it), uniform weights when all scores are 100%. Every client
receives all K trained models (its own among them, as it keeps no copy): K*K models per period,
counted in `bytes_down_xeval`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapps.settings import setting
from strategies.base import Upload
from strategies.peer import pre_aggregate, star_row
from strategies.periods import PeriodicStrategy, PeriodSettings
from strategies.plan import RoundPlan, cross_evaluation


@dataclass(frozen=True)
class FedStarSettings(PeriodSettings):
    """Here, beside the strategy: Fed-Star's clients train and score as FedAvg's do."""

    exclude_self: bool = setting(False)  # drop M(k,k) (the introduction's "all the other")


class FedStar(PeriodicStrategy):
    algo: FedStarSettings
    STEPS_PER_PERIOD = 2  # train, cross-evaluate

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        if self.phase(step)[1] == 0:
            return self.train_plan(server_round, step, participants)
        peers = sorted(self.trained)  # who trained this period, in a fixed order
        models = [self.trained[p] for p in peers]
        return self.make_plan(server_round, step, [
            cross_evaluation(pid, models, peers=peers) for pid in peers])

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        if self.phase(plan.step)[1] == 0:
            self.store_trained(uploads)
            return self.global_arrays
        rows = {}
        for u in uploads:
            peers = plan.get(u.partition_id).facts["peers"]  # type: ignore[union-attr]
            rows[u.partition_id] = star_row(peers, u.scores(len(peers)), u.partition_id,
                                            self.algo.exclude_self)
        return self.end_period(plan, pre_aggregate(self.trained, rows))
