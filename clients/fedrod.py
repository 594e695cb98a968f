"""FedRoD client (Chen & Chao 2022): base + generic head (aggregated) trained with the
balanced-softmax loss, plus a personal head (node state) trained on
CE(out_generic.detach() + out_personal) over detached features. P = generic + personal."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from clients.personal import PersonalHeadClient


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor,
                          class_counts: torch.Tensor) -> torch.Tensor:
    """CE(logits + log n_c, y): classes the client lacks get -inf and drop out of the softmax."""
    return F.cross_entropy(logits + torch.log(class_counts.to(logits.dtype)), y)


class FedRodClient(PersonalHeadClient):
    state_key = "fedrod-personal"

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        counts = torch.bincount(self.data.y_train, minlength=self.personal[-1].out_features)
        counts = counts.to(self.device)

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = self.model.base(x)
            out_g = self.model.head(z)
            out_p = self.personal(z.detach())
            # gradients of the two terms reach disjoint parameters, as with two optimizers
            return (balanced_softmax_loss(out_g, y, counts)
                    + F.cross_entropy(out_g.detach() + out_p, y))

        params = [*self.model.parameters(), *self.personal.parameters()]
        result = self.sgd_epochs(params, loss, self.settings.local_epochs, keep="model")
        self.save_personal()
        return {"train-loss": result}

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.model.base(x)
        g = self.model.head(z)
        return g, g + self.personal(z)
