"""FedRep client (Collins et al. 2021): per round, `head-epochs` (5) on the personal head with
the base frozen, then `base-epochs` (1) on the base with the head frozen (DECISIONS). Upload as
FedPer (`algo.shared-prefix`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clients.personal import PersonalHeadClient
from fedapps.settings import SharedPrefixSettings, setting


@dataclass(frozen=True)
class FedRepSettings(SharedPrefixSettings):
    head_epochs: int = setting(5, ge=1)  # personal head, base frozen
    base_epochs: int = setting(1, ge=1)  # base, head frozen


class FedRepClient(PersonalHeadClient):
    algo: FedRepSettings

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        self.use_personal_head()
        loss_fn = self.task_loss(self.model)
        # Only the listed parameters are stepped; the other part is frozen by construction.
        head_loss = self.sgd_epochs(self.model.head.parameters(), loss_fn,
                                    self.algo.head_epochs, keep="head")
        base_loss = self.sgd_epochs(self.model.base.parameters(), loss_fn,
                                    self.algo.base_epochs, keep="base")
        self.keep_trained_head()
        return {"head-loss": head_loss, "train-loss": base_loss}
