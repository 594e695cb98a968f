"""Local-model baseline: every client trains alone each round; the server aggregates nothing.

Every connected client trains every round (federation.fraction-fit / clients-per-round do not
apply: a local model that skipped rounds would just be less trained). Training messages carry
no arrays (clients/local.py says why); the global model stays the initial one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.base import BaseStrategy, Upload
from strategies.plan import Assignment, RoundPlan


class Local(BaseStrategy):
    def sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        return sorted(available)

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        return self.make_plan(server_round, step, [Assignment(pid, [], [], role="local")
                                                   for pid in participants])

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        return self.global_arrays
