"""FedDyn client (Acar et al. 2021, alpha = 0.01, DECISIONS).

Local objective: CE(w) - <g_k, w> + alpha/2 ||w - w_global||^2, where g_k is the client's
linear correction, kept in the node state and updated after training:
g_k <- g_k - alpha (w_k - w_global).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from clients.arrays import to_numpy
from clients.base import BaseClient
from fedapps.settings import AlgoSettings, setting

STATE = "feddyn-grad"


@dataclass(frozen=True)
class FedDynSettings(AlgoSettings):
    alpha: float = setting(0.01, gt=0)  # regularizer weight (client objective and server h)


class FedDynClient(BaseClient):
    algo: FedDynSettings

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        alpha = self.algo.alpha
        w_global = self.snapshot(self.model)
        saved = self.load_state(STATE)
        grads = ([torch.from_numpy(g).to(self.device) for g in saved] if saved is not None
                 else [torch.zeros_like(w) for w in w_global])

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            linear = sum(torch.sum(p * g) for p, g in zip(self.model.parameters(), grads,
                                                          strict=True))
            return (self.task.loss(self.model(x), y) - linear
                    + alpha / 2 * self.proximal(self.model, w_global))

        mean_loss = self.sgd_epochs(self.model.parameters(), loss, self.settings.local_epochs,
                                    keep="model")
        with torch.no_grad():
            new = [g - alpha * (p.detach() - w) for g, p, w in
                   zip(grads, self.model.parameters(), w_global, strict=True)]
        self.save_state(STATE, [to_numpy(g) for g in new])  # float32, also under bf16
        return {"train-loss": mean_loss}
