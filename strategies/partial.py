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
from strategies.submodel import ParamSpec, extract, group_indices, selective_average

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

    def client_weight(self, upload: Upload) -> float:
        """Seed 004 Table 3.4: `none` (equal, FedRolex's default), `model-size` (the sub-model's
        parameter count), `model-update` (local SGD steps, proportional to the client's samples
        at a fixed batch size and epoch count) or `hybrid` (their product)."""
        scheme = self.algo.weighting
        size = float(sum(a.size for a in upload.arrays))  # shapes were validated on arrival
        updates = float(upload.num_examples)
        return {"none": 1.0, "model-size": size, "model-update": updates,
                "hybrid": size * updates}[scheme]

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        index = {a.partition_id: a.facts["index"] for a in plan.assignments}
        rows = None
        if self.algo.label_mask and self.train_classes is not None:
            rows = [self.train_classes[u.partition_id] for u in uploads]
        return selective_average(self.global_arrays, self.specs,
                                 [(index[u.partition_id], u.arrays, self.client_weight(u))
                                  for u in uploads], rows, self.classifier_arrays)


class FedRolex(PartialTraining):
    scheme = "rolling"

    def index_scheme(self) -> str:
        """algo.roll: forward (eq. 3.4, the default) or backward (the FedRolex code)."""
        return "rolling-backward" if self.algo.roll == "backward" else "rolling"


class HeteroFL(PartialTraining):
    scheme = "static"


class FedDropout(PartialTraining):
    scheme = "random"
