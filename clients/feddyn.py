"""FedDyn client (Acar et al. 2021, alpha = 0.01, DECISIONS).

Local objective: CE(w) - <g_k, w> + alpha/2 ||w - w_global||^2, where g_k is the client's
linear correction, kept in the node state and updated after training:
g_k <- g_k - alpha (w_k - w_global). Option `proximal-norm: unsquared` uses PFLlib's
alpha/2 ||w - w_global||_2 instead (issue 16 item 6).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    # squared: alpha/2 ||w - w_global||^2 (FedDyn paper, Alg. 1); unsquared: alpha/2 ||w -
    # w_global||_2 over all parameters as one vector (PFLlib system/flcore/clients/clientdyn.py:
    # `loss += self.alpha/2 * torch.norm(v1 - self.global_model_vector, 2)`)
    proximal_norm: str = setting("squared", choices=("squared", "unsquared"))


def distance(params: Iterable[torch.Tensor], reference: list[torch.Tensor]) -> torch.Tensor:
    """||w - w_ref||_2 over all parameters as one vector (PFLlib's model_parameter_vector);
    its gradient at w = w_ref (where every round starts) is 0, as torch.norm's."""
    return torch.linalg.vector_norm(torch.cat([(p - r).reshape(-1) for p, r in
                                               zip(params, reference, strict=True)]))


class FedDynClient(BaseClient):
    algo: FedDynSettings

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        alpha = self.algo.alpha
        w_global = self.snapshot(self.model)
        saved = self.load_state(STATE)
        grads = ([torch.from_numpy(g).to(self.device) for g in saved] if saved is not None
                 else [torch.zeros_like(w) for w in w_global])

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.objective(x, y, w_global, grads)

        mean_loss = self.sgd_epochs(self.model.parameters(), loss, self.settings.local_epochs,
                                    keep="model")
        with torch.no_grad():
            new = [g - alpha * (p.detach() - w) for g, p, w in
                   zip(grads, self.model.parameters(), w_global, strict=True)]
        self.save_state(STATE, [to_numpy(g) for g in new])  # float32, also under bf16
        return {"train-loss": mean_loss}

    def objective(self, x: torch.Tensor, y: torch.Tensor, w_global: list[torch.Tensor],
                  grads: list[torch.Tensor]) -> torch.Tensor:
        """The local loss: task loss - <g_k, w> + alpha/2 * (squared or unsquared) distance."""
        linear = sum(torch.sum(p * g) for p, g in zip(self.model.parameters(), grads,
                                                      strict=True))
        prox = (self.proximal(self.model, w_global) if self.algo.proximal_norm == "squared"
                else distance(self.model.parameters(), w_global))
        return self.task.loss(self.model(x), y) - linear + self.algo.alpha / 2 * prox
