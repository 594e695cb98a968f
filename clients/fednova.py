"""FedNova client (Wang et al. 2020): FedAvg's local training, plus the two numbers the server
needs to normalize the update: the local step count tau_i and a_i (strategies/aggregation.py
`nova_normalizer`, from tau_i and the SGD momentum)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clients.base import BaseClient
from fedapps.settings import AlgoSettings, setting
from strategies.aggregation import nova_normalizer


@dataclass(frozen=True)
class FedNovaSettings(AlgoSettings):
    gmf: float = setting(0.0, ge=0, le=1)  # server (global) momentum factor; 0 = none


class FedNovaClient(BaseClient):
    algo: FedNovaSettings
    local_steps = 0

    def sgd(self, params: Any, keep: str | None = None) -> torch.optim.Optimizer:
        """The base optimizer with a counter on its steps: tau_i is what really ran (partial
        batches, epochs or a step budget included), not a formula of the data size."""
        opt = super().sgd(params, keep)
        opt.register_step_post_hook(self._count_step)
        return opt

    def _count_step(self, *_: Any) -> None:
        self.local_steps += 1

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        self.local_steps = 0
        metrics = super().local_train(config) or {}
        tau = self.local_steps
        return {**metrics, "local-steps": tau,
                "normalizer": nova_normalizer(tau, self.settings.momentum),
                "lr": self.settings.lr_at(self.server_round)}
