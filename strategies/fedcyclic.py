"""Fed-Cyclic (seed 003 Algorithm 1): one model relayed through the round's participants one
after another; the server only relays (no averaging) and the round's global model is the last
client's. Each hop is one step of the round, so a stopped run resumes at the next hop.

The relay order is a seeded permutation of all clients, kept across rounds (DECISIONS);
`order: reshuffle` draws a new one every round (the thesis's ablation suggestion).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedapps.settings import AlgoSettings, setting
from strategies.base import BaseStrategy, Upload
from strategies.plan import Assignment, RoundPlan


@dataclass(frozen=True)
class FedCyclicSettings(AlgoSettings):
    """Here, beside the strategy: Fed-Cyclic's only own code (its clients train as FedAvg's)."""

    order: str = setting("fixed", choices=("fixed", "reshuffle"))  # relay order across rounds


class FedCyclic(BaseStrategy):
    algo: FedCyclicSettings

    def steps_per_round(self, server_round: int) -> int:
        return min(self.clients_per_round, self.num_clients)

    def relay_order(self, server_round: int, participants: list[int]) -> list[int]:
        """The participants in relay order: by their place in the seeded permutation."""
        reshuffle = self.algo.order == "reshuffle"
        key = [self.seed, server_round, 303] if reshuffle else [self.seed, 303]
        rank = np.argsort(np.random.default_rng(key).permutation(self.num_clients))
        return sorted(participants, key=lambda pid: int(rank[pid]))

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        order = self.relay_order(server_round, participants)
        if step >= len(order):  # fewer clients connected than planned hops: relay nothing
            return self.make_plan(server_round, step, [])
        hop = Assignment(order[step], self.global_arrays, self.shared_arrays(), role="relay")
        return self.make_plan(server_round, step, [hop])

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        """No averaging: the hop's trained model goes on (eq. 3.7)."""
        return self.merge(uploads[0].arrays)
