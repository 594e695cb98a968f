"""FedPer client (Arivazhagan et al. 2019): base shared, head personal.

The client trains base + its own head on CE. With `algo.shared-prefix: ''` (default, seed 000
section 6) it uploads base + head so the server's aggregate of full models gives G; with
`'base.'` the head never leaves the client. Either way the client never trains on the
aggregated head: P = global base + own head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clients.personal import PersonalHeadClient
from fedapps.settings import SharedPrefixSettings


@dataclass(frozen=True)
class FedPerSettings(SharedPrefixSettings):
    """Only `shared-prefix` (see SharedPrefixSettings)."""


class FedPerClient(PersonalHeadClient):
    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        self.use_personal_head()
        loss = self.sgd_epochs(self.model.parameters(), self.task_loss(self.model),
                               self.settings.local_epochs, keep="model")
        self.keep_trained_head()
        return {"train-loss": loss}
