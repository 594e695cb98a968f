"""FedBABU client (Oh et al. 2022): the head stays frozen at its random initialization during
FL and only the base is trained; before personal evaluation a copy of the head is fine-tuned
for `finetune-epochs` (10) on the local train split (the copy is not kept, DECISIONS)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from clients.base import BaseClient
from fedapps.settings import SharedPrefixSettings, setting


@dataclass(frozen=True)
class FedBabuSettings(SharedPrefixSettings):
    finetune_epochs: int = setting(10, ge=1)  # head copy fine-tuned before personal evaluation


class FedBabuClient(BaseClient):
    algo: FedBabuSettings
    _tuned: torch.nn.Module | None = None  # fine-tuned head of the current evaluation
    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        loss = self.sgd_epochs(self.model.base.parameters(), self.task_loss(self.model),
                               self.settings.local_epochs)
        return {"train-loss": loss}

    def fine_tuned_head(self) -> torch.nn.Module:
        """The head fine-tuned on features of the frozen base (computed once, not per epoch)."""
        head = copy.deepcopy(self.model.head)
        with torch.no_grad():
            z = self.model.base(self.data.x_train.to(self.device))
        with torch.enable_grad():
            head.train()
            self.sgd_epochs(head.parameters(), self.task_loss(head),
                            self.algo.finetune_epochs, x=z,
                            y=self.data.y_train)
        head.eval()
        return head

    def evaluate(self, parameters, config):
        self._tuned = None
        return super().evaluate(parameters, config)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tuned is None:
            self._tuned = self.fine_tuned_head()
        z = self.model.base(x)
        return self.model.head(z), self._tuned(z)
