"""Fed-Cyclic (seed 003 Algorithm 1): one model relayed through the round's participants one
after another; the server only relays (no averaging) and the round's global model is the last
client's. Each hop is one step of the round, so a stopped run resumes at the next hop.

The relay order is a seeded permutation of all clients, kept across rounds (DECISIONS);
`order: reshuffle` draws a new one every round (the thesis's ablation suggestion).

Beyond the thesis, `chains: C` splits the relay order into C contiguous groups (sizes differ
by at most one) that relay side by side: step s trains the s-th client of every chain, each
chain carrying its own model (server state between steps, so a mid-round checkpoint resumes),
and after the last hop the chains' end models are averaged by their data sizes. C = 1 is the
thesis; C = participants is FedAvg (one local pass, same aggregate); wall time per round falls
by C because a round has ceil(participants / C) steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from fedapps.config import clients_per_round
from fedapps.errors import ConfigError
from fedapps.settings import AlgoSettings, setting
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy, Upload
from strategies.plan import Assignment, RoundPlan

CHAIN = "chain"  # checkpoint state names: chain<i> (its model), chain-meta (round, sizes)
META = "chain-meta"


def relay_order(seed: int, server_round: int, num_clients: int, reshuffle: bool,
                participants: list[int]) -> list[int]:
    """The participants in relay order: by their place in the seeded permutation of all
    clients, drawn once per run (fixed) or once per round (reshuffle)."""
    key = [seed, server_round, 303] if reshuffle else [seed, 303]
    rank = np.argsort(np.random.default_rng(key).permutation(num_clients))
    return sorted(participants, key=lambda pid: int(rank[pid]))


@dataclass(frozen=True)
class FedCyclicSettings(AlgoSettings):
    """Here, beside the strategy: Fed-Cyclic's only own code (its clients train as FedAvg's)."""

    order: str = setting("fixed", choices=("fixed", "reshuffle"))  # relay order across rounds
    chains: int = setting(1, ge=1)  # relay chains side by side (1 = the thesis)

    def check_run(self, cfg: DictConfig) -> None:
        """Every chain needs at least one client of the round."""
        k = min(clients_per_round(cfg), int(cfg.federation["num-clients"]))
        if self.chains > k:
            raise ConfigError(f"algo.chains={self.chains}: must be <= the clients per round "
                              f"({k})")


class FedCyclic(BaseStrategy):
    algo: FedCyclicSettings

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chain_round = 0  # the round the chain state below belongs to (0: none)
        self.chain_models: list[list[np.ndarray]] = []  # each chain's model after its last hop
        self.chain_sizes: list[int] = []  # num_examples of the hops each chain has done

    @property
    def participants(self) -> int:
        return min(self.clients_per_round, self.num_clients)

    def steps_per_round(self, server_round: int) -> int:
        return math.ceil(self.participants / self.algo.chains)

    def relay_order(self, server_round: int, participants: list[int]) -> list[int]:
        return relay_order(self.seed, server_round, self.num_clients,
                           self.algo.order == "reshuffle", participants)

    def chain_groups(self, server_round: int, participants: list[int]) -> list[list[int]]:
        """The relay order cut into `chains` contiguous groups (the first len % C one longer),
        numbered by their first client's partition id: with one client per chain the end
        average then adds the models in FedAvg's order (partition ids), bit for bit."""
        order = self.relay_order(server_round, participants)
        groups = [list(map(int, g)) for g in np.array_split(order, self.algo.chains)]
        return sorted(groups, key=lambda g: g[0] if g else self.num_clients)

    def current_chains(self, server_round: int) -> list[list[np.ndarray]]:
        """Each chain's model now: the round's start model until the chain has done a hop."""
        if self.chain_round != server_round:
            return [self.global_arrays] * self.algo.chains
        return self.chain_models

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        models = self.current_chains(server_round)
        hops = [Assignment(group[step], models[c], self.shared_arrays(), role="relay",
                           facts={CHAIN: c}, reference=self.shared_part(models[c]))
                for c, group in enumerate(self.chain_groups(server_round, participants))
                if step < len(group)]  # fewer clients connected than planned: fewer hops
        return self.make_plan(server_round, step, hops)

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        """Each hop's trained model goes on along its chain (eq. 3.7); the global model is the
        size-weighted average of the chains (one chain: its model, no averaging)."""
        models = list(self.current_chains(plan.round))
        sizes = self.chain_sizes if self.chain_round == plan.round else [0] * len(models)
        for u in uploads:
            c = plan.get(u.partition_id).facts[CHAIN]  # type: ignore[union-attr]
            models[c] = self.merge(u.arrays)
            sizes[c] += u.num_examples
        self.chain_round, self.chain_models, self.chain_sizes = plan.round, models, sizes
        if plan.last_step:
            self.chain_round, self.chain_models, self.chain_sizes = 0, [], []
        if len(models) == 1:
            return models[0]
        done = [(m, n) for m, n in zip(models, sizes, strict=True) if n > 0]
        return weighted_average([m for m, _ in done], [n for _, n in done])

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        """The chains' models and sizes while a round is open (a mid-round resume needs them)."""
        if not self.chain_round:
            return {}
        state = {f"{CHAIN}{c}": list(m) for c, m in enumerate(self.chain_models)}
        state[META] = [np.asarray([self.chain_round, *self.chain_sizes], dtype=np.int64)]
        return state

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        if META not in state:
            self.chain_round, self.chain_models, self.chain_sizes = 0, [], []
            return
        meta = [int(v) for v in state[META][0]]
        self.chain_round, self.chain_sizes = meta[0], meta[1:]
        self.chain_models = [[np.asarray(a) for a in state[f"{CHAIN}{c}"]]
                             for c in range(len(self.chain_sizes))]
