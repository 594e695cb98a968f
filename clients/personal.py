"""Clients with a personal head kept in the node state (FedPer, FedRep, FedBABU, FedRoD,
FedReb). The personal head never leaves the client; `predict` gives G from the global model
and P from the global base with the personal head (subclasses may combine heads)."""

from __future__ import annotations

from typing import Any

import torch

from clients.arrays import get_arrays
from clients.base import BaseClient


class PersonalHeadClient(BaseClient):
    """Keeps `self.personal`, a head of the model's head shape, across rounds."""

    state_key = "personal-head"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The personal head starts as the initial head (the seeded model every process
        # builds), so a client that has never trained still has a defined personal model.
        self.personal = self.persistent_copy(self.model.head, self.state_key)

    def save_personal(self) -> None:
        self.save_state(self.state_key, get_arrays(self.personal))

    def use_personal_head(self) -> None:
        """Train on the personal head: copy it into the model's head slot."""
        self.model.head.load_state_dict(self.personal.state_dict())

    def keep_trained_head(self) -> None:
        """After training with the personal head in the model: store it as the personal head."""
        self.personal.load_state_dict(self.model.head.state_dict())
        self.save_personal()

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.model.base(x)
        return self.model.head(z), self.personal(z)
