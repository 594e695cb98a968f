"""GPFL client (Zhang et al. ICCV 2023; lambda = 0.1, eta = 0.001, DECISIONS).

Features z = base(x) pass the Conditional Valve twice: with the personalized conditional input
(sum_c p_c E_c, p = the client's class shares) into the personal head (node state), and with the
generic input (mean_c E_c) into the Global Category Embedding loss, an angular softmax over
cos(z_G, E_c) plus lambda * ||z_G - E_frozen[y]||. GCE and CoV use weight decay eta. The base,
GCE, CoV, conditional inputs and (as for FedPer) the head are uploaded and averaged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from clients.personal import PersonalHeadClient
from fedapps.settings import AlgoSettings, setting


@dataclass(frozen=True)
class GpflSettings(AlgoSettings):
    lambda_: float = setting(0.1, ge=0)  # YAML `lambda`: weight of ||z_G - E_frozen[y]||
    eta: float = setting(0.001, ge=0)  # weight decay of GCE and CoV


def gce_loss(z: torch.Tensor, y: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over cosine similarities between features and class embeddings."""
    return F.cross_entropy(F.normalize(z) @ F.normalize(embeddings).T, y)


class GpflClient(PersonalHeadClient):
    algo: GpflSettings
    state_key = "gpfl-personal-head"

    def class_shares(self) -> torch.Tensor:
        counts = torch.bincount(self.data.y_train, minlength=self.model.gce.num_embeddings)
        return counts.float().to(self.device) / max(len(self.data.y_train), 1)

    def conditional_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(generic, personalized) inputs from the current GCE, as constants."""
        emb = self.model.gce.weight.detach()
        return emb.mean(0), self.class_shares().to(emb.dtype) @ emb  # half under fp16

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        lam, eta = self.algo.lambda_, self.algo.eta
        m = self.model
        generic, personal = self.conditional_inputs()
        m.generic_input.copy_(generic)
        m.personal_input.copy_(personal)
        frozen = m.gce.weight.detach().clone()
        self.use_personal_head()

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = m.base(x)
            out = m.head(m.cov(z, personal))
            z_g = m.cov(z, generic)
            return (F.cross_entropy(out, y) + gce_loss(z_g, y, m.gce.weight)
                    + lam * torch.norm(z_g - frozen[y], 2))

        valve = [*m.gce.parameters(), *m.gamma.parameters(), *m.beta.parameters()]
        opt = self.sgd([{"params": [*m.base.parameters(), *m.head.parameters()]},
                        {"params": valve, "weight_decay": eta}], keep="model")
        result = self.sgd_epochs([], loss, self.settings.local_epochs, optimizer=opt)
        self.keep_trained_head()
        return {"train-loss": result}

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G: the aggregated model (head and inputs averaged); P: own head, own input."""
        z = self.model.base(x)
        _, personal = self.conditional_inputs()
        return self.model(x), self.personal(self.model.cov(z, personal))
