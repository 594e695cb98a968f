"""FedProx client (Li et al. 2020): local CE + mu/2 ||w - w_global||^2 (mu = 0.001, DECISIONS)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clients.base import BaseClient
from fedapps.settings import AlgoSettings, setting


@dataclass(frozen=True)
class FedProxSettings(AlgoSettings):
    mu: float = setting(0.001, ge=0)  # weight of the proximal term


class FedProxClient(BaseClient):
    algo: FedProxSettings

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        mu = self.algo.mu
        w_global = self.snapshot(self.model)

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.task.loss(self.model(x), y) + mu / 2 * self.proximal(self.model,
                                                                               w_global)

        return {"train-loss": self.sgd_epochs(self.model.parameters(), loss,
                                              self.settings.local_epochs)}
