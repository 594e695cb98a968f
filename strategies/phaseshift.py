"""Phase-shift communication (seed 002 Ch. 4, Alg. 2/3 with the digest's corrected queue
semantics): the round's active clients form n groups ("phases") offset by one round. Every
active client downloads the server model; the newest group starts from it, the middle groups
merge it into their persistent local model (drift correction), the oldest group merges, trains
and uploads, and the server averages only that group (by n_k). Traffic per round is (n+1)/(2n)
of FedAvg's with the same active clients (eq. 4.2); n = 1 is FedAvg exactly.

Choices the thesis leaves open (spec section 9 items 8-13, DECISIONS seed 002):
- Active clients per round = the run's clients per round (federation.clients-per-round or
  fraction-fit x num-clients), split into n groups; full participation locks the groups from
  round 1 (Ch. 4). The group drawn at round t has size sizes[t % n], near-equal sizes that
  sum to the clients per round, so any count >= n works (Alg. 2's m when n divides it).
- The queue before round 1 holds n - 1 disjoint groups from a seeded permutation (the n-th
  initial group is popped at once); each round the oldest group returns to the pool and a new
  one is drawn, with FedAvg's seeded sampler, from the clients not in the queue. The queue is a
  pure function of (seed, round) (strategies/phases.py), so a resume recomputes it.
- Roles by position: newest = fresh, oldest = return, others = correct (n = 2: fresh and
  return, no pure correction); n = 1 is one group that starts fresh and returns (the thesis's
  special case "only the global model"), i.e. FedAvg.
- Every local model starts as w_1: in round 1 N = 0, so every correcting client keeps the
  received w_1. N is the sample count of the last returning group (checkpointed); a round
  whose returning group all failed keeps the model and N.
- The merge averages the whole state (parameters and buffers); the local optimizer (SGD
  momentum) restarts every round, as every client here does.
- Last round of the run: every group does its usual start, trains and uploads; the server
  averages all of them by n_k (the only true global model). With partial participation "all
  clients" are the queue's clients: the others hold no model in progress.
- Evaluation every round is of the server model (one group's aggregate, jagged by design);
  P = G.
- Epoch-reduction mode trains E (n+1)/(2n) epochs, run as round(E' ceil(n_k/B)) minibatch
  steps (an integer E' gives exactly the epoch loop).
- Non-uploading clients answer with no arrays, so bytes_up counts only real uploads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from clients.phaseshift import PhaseShiftSettings
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy, Upload
from strategies.phases import UPLOADING, phase_queue, phase_role
from strategies.plan import Assignment, RoundPlan

STATE = "phase-shift-returned"  # checkpoint name of N


class PhaseShift(BaseStrategy):
    algo: PhaseShiftSettings

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.returned_examples = 0  # N: samples behind the current server model (0 = w_1)

    def queue(self, server_round: int) -> list[list[int]]:
        """The round's groups, newest first."""
        return phase_queue(self.seed, self.num_clients, self.clients_per_round,
                           self.algo.phases, server_round)

    def sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        """The queue's clients that are connected (not a fresh draw: groups persist)."""
        connected = set(available)
        return sorted(p for group in self.queue(server_round) for p in group if p in connected)

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        """Every active client gets the server model, its role and N; only uploading roles are
        expected to send arrays."""
        last = server_round == self.num_rounds
        taking_part = set(participants)
        assignments = []
        for position, group in enumerate(self.queue(server_round)):
            role = phase_role(position, self.algo.phases, last)
            expected = self.shared_arrays() if role in UPLOADING else []
            config = {"phase-role": role, "phase-n": self.returned_examples}
            assignments += [Assignment(pid, self.global_arrays, expected, config, role=role)
                            for pid in group if pid in taking_part]
        assignments.sort(key=lambda a: a.partition_id)
        return self.make_plan(server_round, step, assignments)

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        """FedAvg over the returning group only (every group in the last round)."""
        roles = {a.partition_id: a.role for a in plan.assignments}
        returned = [u for u in uploads if roles[u.partition_id] in UPLOADING]
        if not returned:
            return self.global_arrays
        self.returned_examples = sum(u.num_examples for u in returned)
        return self.merge(weighted_average([u.arrays for u in returned],
                                           [u.num_examples for u in returned]))

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        return {STATE: [np.array([self.returned_examples], dtype=np.int64)]}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        self.returned_examples = int(state[STATE][0][0])
