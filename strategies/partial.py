"""Model-heterogeneous strategies (seed 004): each sampled client gets a sub-model sized to its
capacity beta, cut out of the global model by an index scheme; the returned sub-models are put
back by selective averaging (eq. 3.10, equal client weights). FedRolex rolls the window one node
per round, HeteroFL keeps the leading nodes, Federated Dropout draws them at random; nothing
else differs between the three."""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies.base import BaseStrategy, Upload
from strategies.plan import Assignment, RoundPlan
from strategies.submodel import (
    ParamSpec,
    Weight,
    extract,
    group_indices,
    selective_average,
    selector,
)

INCOME = {1.0: 0.06, 0.5: 0.10, 0.25: 0.11, 0.125: 0.18, 0.0625: 0.55}  # a6-b10-c11-d18-e55


def capacities(distribution: str, levels: list[float], num_clients: int, rho: float,
               rng: np.random.Generator) -> np.ndarray:
    """One capacity per client: uniform over `levels`, two-level rho (share rho at the largest
    level, the rest at the smallest) or the household-income mix of seed 004 Table 3.3."""
    if distribution == "uniform":
        return rng.choice(np.asarray(levels, dtype=float), size=num_clients)
    if distribution == "rho":
        big = rng.random(num_clients) < rho
        return np.where(big, max(levels), min(levels)).astype(float)
    if distribution == "income":
        values = np.asarray(list(INCOME))
        return rng.choice(values, size=num_clients, p=np.asarray(list(INCOME.values())))
    raise ValueError(f"unknown capacity distribution {distribution!r}")


class PartialTraining(BaseStrategy):
    scheme = "rolling"

    def __init__(self, *, specs: list[tuple[str | None, ...]], widths: dict[str, int],
                 train_classes: list[list[bool]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.specs = [ParamSpec(tuple(g)) for g in specs]
        self.widths = widths
        self.fixed = self._draw(0)
        # per client, which classes its training split holds (label-masked classifier rows)
        self.train_classes = None if train_classes is None else \
            [np.asarray(c, dtype=bool) for c in train_classes]
        self.classifier_arrays = frozenset(
            i for i, name in enumerate(self.array_names) if name.startswith("classifier."))
        # Table 3.4's weights apply to conv kernels only (the 4-D arrays), as the FedRolex code
        self.conv_arrays = [i for i, a in enumerate(self.global_arrays) if a.ndim == 4]
        # model-update / hybrid: how often each conv entry was updated, starting at 1 (the
        # FedRolex code's tmp_counts); server state, kept in the checkpoint
        self.update_counts = {i: np.ones(self.global_arrays[i].shape) for i in self.conv_arrays} \
            if self.algo.weighting in ("model-update", "hybrid") else {}

    def _draw(self, server_round: int) -> np.ndarray:
        a = self.algo
        rng = np.random.default_rng([self.seed, server_round, 404])
        return capacities(a.capacity, list(a.levels), self.num_clients, a.rho, rng)

    def beta(self, server_round: int, partition_id: int) -> float:
        """The client's capacity this round, relative to the global model (divided by gamma,
        the server model's size over the largest client's)."""
        table = self.fixed if self.algo.assignment == "fixed" else self._draw(server_round)
        return float(table[partition_id]) / self.algo.server_scale

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        """Each participant's capacity, index sets and sub-model; the index sets travel in the
        plan to validation (the upload must have the sub-model's shapes) and aggregation."""
        assignments = []
        for pid in participants:
            beta = self.beta(server_round, pid)
            rng = np.random.default_rng([self.seed, server_round, pid, 405])
            index = group_indices(self.widths, self.index_scheme(), beta, server_round - 1, rng)
            sub = extract(self.global_arrays, self.specs, index)
            assignments.append(Assignment(pid, sub, sub, {"beta": beta},
                                          facts={"index": index}))
        return self.make_plan(server_round, step, assignments)

    def index_scheme(self) -> str:
        return self.scheme

    def client_weights(self, uploads: list[Upload],
                       index: dict[int, dict[str, np.ndarray]]) -> list[Weight]:
        """Seed 004 Table 3.4 as the FedRolex code defines it (resnet_server.py `weighting`),
        one weight per upload (clients in partition order): `none` = equal (FedRolex's
        default, eq. 3.10); for conv kernels only, every other array keeping equal weights,
        `model-size` = the layer's local width (its output channels in the client's
        sub-model), `model-update` = each entry's update count (1 + every earlier holder) and
        `hybrid` = their product. Counts are per entry, so with the round's starting counts
        every holder would weigh the same (the plain mean); the reference's counts grow
        while it walks the round's clients (its copy aliases them after the first state
        entry), so a later client weighs more: that is what we compute. The reference also
        weights norms, biases and classifier by counts under every scheme (A7: we keep
        eq. 3.10's equal weights there)."""
        scheme = self.algo.weighting
        if scheme == "none":
            return [1.0] * len(uploads)
        running = {i: c.copy() for i, c in self.update_counts.items()}
        out: list[Weight] = []
        for u in uploads:
            weights: list[float | np.ndarray] = [1.0] * len(u.arrays)
            for i in self.conv_arrays:
                w: float | np.ndarray = float(u.arrays[i].shape[0]) \
                    if scheme in ("model-size", "hybrid") else 1.0
                if i in running:
                    sel = selector(self.specs[i], index[u.partition_id], running[i].shape)
                    w = w * (self.update_counts[i] if i == 0 else running[i])[sel]
                    running[i][sel] += 1
                weights[i] = w
            out.append(weights)
        self.update_counts = running
        return out

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        index = {a.partition_id: a.facts["index"] for a in plan.assignments}
        rows = None
        if self.algo.label_mask and self.train_classes is not None:
            rows = [self.train_classes[u.partition_id] for u in uploads]
        weights = self.client_weights(uploads, index)
        return selective_average(self.global_arrays, self.specs,
                                 [(index[u.partition_id], u.arrays, w)
                                  for u, w in zip(uploads, weights, strict=True)],
                                 rows, self.classifier_arrays)

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        return {"update-counts": list(self.update_counts.values())} if self.update_counts else {}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        if self.update_counts:
            self.update_counts = {i: np.asarray(a, dtype=np.float64) for i, a in
                                  zip(self.conv_arrays, state["update-counts"], strict=True)}


class FedRolex(PartialTraining):
    scheme = "rolling"

    def index_scheme(self) -> str:
        """algo.roll: forward (eq. 3.4, the default) or backward (the FedRolex code)."""
        return "rolling-backward" if self.algo.roll == "backward" else "rolling"


class HeteroFL(PartialTraining):
    scheme = "static"


class FedDropout(PartialTraining):
    scheme = "random"
