"""FedBABU client (Oh et al. 2022): the head stays frozen at its random initialization during
FL and only the base is trained; before personal evaluation a copy is fine-tuned for
`finetune-epochs` (10) on the local train split and then dropped (DECISIONS).

What the copy fine-tunes (`finetune-part`): `full` (default) fine-tunes the whole network, as
the FedBABU paper's evaluation, PFLlib's clientBABU.fine_tune (['base', 'head']) and Flower's
fedbabu baseline (SGD over net.parameters()) do; `head` fine-tunes the head alone on the frozen
base's features. Measured (issue 16): with the FL learning rate the head-only fine-tuning
diverges once the base's features grow (mean |z| 17 -> 65 over four quickstart rounds, tuning
loss 4.2 -> 23.5 in epoch 3), so P fell while G rose; the full fine-tuning does not.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from clients.base import BaseClient
from fedapps.settings import SharedPrefixSettings, setting

Personal = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, base features) -> logits


@dataclass(frozen=True)
class FedBabuSettings(SharedPrefixSettings):
    finetune_epochs: int = setting(10, ge=1)  # copy fine-tuned before personal evaluation
    finetune_part: str = setting("full", choices=("full", "head"))


class FedBabuClient(BaseClient):
    algo: FedBabuSettings
    _tuned: Personal | None = None  # the fine-tuned copy of the current evaluation

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        loss = self.sgd_epochs(self.model.base.parameters(), self.task_loss(self.model),
                               self.settings.local_epochs, keep="base")
        return {"train-loss": loss}

    def fine_tuned(self) -> Personal:
        """A copy fine-tuned on the local train split: the whole model, or the head alone on
        features of the frozen base (computed once, not per epoch)."""
        if self.algo.finetune_part == "head":
            part = copy.deepcopy(self.model.head)
            with torch.no_grad():
                x = self.model.base(self.data.x_train.to(self.device))
        else:
            part, x = copy.deepcopy(self.model), self.data.x_train
        with torch.enable_grad():
            part.train()
            self.sgd_epochs(part.parameters(), self.task_loss(part), self.algo.finetune_epochs,
                            x=x, y=self.data.y_train)
        part.eval()
        if self.algo.finetune_part == "head":
            return lambda x, z: part(z)
        return lambda x, z: part(x)

    def evaluate(self, parameters, config):
        self._tuned = None
        return super().evaluate(parameters, config)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._tuned is None:
            self._tuned = self.fine_tuned()
        z = self.model.base(x)
        return self.model.head(z), self._tuned(x, z)
