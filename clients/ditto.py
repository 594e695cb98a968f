"""Ditto client (Li et al. 2021; lambda = 0.1, 5 personal epochs, DECISIONS).

Each round the personal model v (node state, never uploaded) trains on
CE(v) + lambda/2 ||v - w_global||^2 for `personal-epochs`, then the global model trains as in
FedAvg and is uploaded. G uses the global model, P the personal one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clients.arrays import get_arrays
from clients.base import BaseClient
from fedapps.settings import AlgoSettings, setting

STATE = "ditto-personal"


@dataclass(frozen=True)
class DittoSettings(AlgoSettings):
    lambda_: float = setting(0.1, ge=0)  # YAML `lambda`: pull of v towards the global model
    personal_epochs: int = setting(5, ge=1)


class DittoClient(BaseClient):
    algo: DittoSettings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.personal = self.persistent_copy(self.model, STATE)

    def train_personal(self, w_global: list[torch.Tensor], epochs: int) -> float:
        lam = self.algo.lambda_

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.task.loss(self.personal(x), y) + lam / 2 * self.proximal(
                self.personal, w_global)

        self.personal.train()
        result = self.sgd_epochs(self.personal.parameters(), loss, epochs, keep="personal")
        self.save_state(STATE, get_arrays(self.personal))
        return result

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        personal_loss = self.train_personal(self.snapshot(self.model),
                                            self.algo.personal_epochs)
        loss = self.sgd_epochs(self.model.parameters(), self.task_loss(self.model),
                               self.settings.local_epochs, keep="model")
        return {"train-loss": loss, "personal-loss": personal_loss}

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.personal.eval()
        return self.model(x), self.personal(x)
