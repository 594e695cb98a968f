"""FedProx client (Li et al. 2020): local CE + mu/2 ||w - w_global||^2 (mu = 0.001, DECISIONS).

mu comes from the fit config when the server sends one (`algo.mu-mode` auto keeps it on the
server, strategies/fedprox.py), else from `algo.mu`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clients.base import BaseClient
from fedapps.settings import AlgoSettings, setting


@dataclass(frozen=True)
class FedProxSettings(AlgoSettings):
    mu: float = setting(0.001, ge=0)  # weight of the proximal term (auto: its start value)
    # fixed: mu as set; auto: the FedProx paper's heuristic (+0.1 when the clients' training
    # loss rises, -0.1 after 5 consecutive falls, never below 0)
    mu_mode: str = setting("fixed", choices=("fixed", "auto"))


class FedProxClient(BaseClient):
    algo: FedProxSettings

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        mu = float(config.get("mu", self.algo.mu))
        w_global = self.snapshot(self.model)
        task_sum = torch.zeros((), device=self.device)  # the data term alone, for auto mu
        batches = [0]

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            task = self.task.loss(self.model(x), y)
            task_sum.add_(task.detach())
            batches[0] += 1
            return task + mu / 2 * self.proximal(self.model, w_global)

        mean = self.sgd_epochs(self.model.parameters(), loss, self.settings.local_epochs,
                               keep="model")
        return {"train-loss": mean, "task-loss": float(task_sum) / max(batches[0], 1), "mu": mu}
