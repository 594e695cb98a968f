"""The client of the periodic peer methods (Fed-Star, RingFed; strategies/periods.py).

It trains as FedAvg's client does, but exchanges only the arrays the strategy shares (with
`exchange: trainable` the frozen parameters stay home: every process builds them identically)
and, with `personal: pre-aggregate`, receives its last pre-aggregate beside the global model
for evaluation: G = the global model, P = that pre-aggregate.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from clients.arrays import get_named, set_named
from clients.base import BaseClient
from fedapps.models import frozen_names


class PeerClient(BaseClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        frozen = frozen_names(self.model) if getattr(self.algo, "exchange", "all") == \
            "trainable" else set()
        self.keys = [k for k in self.model.state_dict() if k not in frozen]  # exchanged
        self.personal_model: torch.nn.Module | None = None
        self.evaluating = False  # P from the personal model only in evaluate (not in scoring)

    def load_global(self, parameters: list[np.ndarray]) -> None:
        set_named(self.model, self.keys, parameters)

    def upload(self) -> list[np.ndarray]:
        return get_named(self.model, self.keys)

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]):
        """Global arrays first; with `personal: pre-aggregate` the personal model's follow."""
        if getattr(self.algo, "personal", "global") == "pre-aggregate":
            n = len(self.keys)
            if self.personal_model is None:
                self.personal_model = copy.deepcopy(self.model)
            set_named(self.personal_model, self.keys, parameters[n:])
            self.personal_model.eval()
            parameters = parameters[:n]
        self.evaluating = True
        try:
            return super().evaluate(parameters, config)
        finally:
            self.evaluating = False

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(x)
        if self.personal_model is None or not self.evaluating:
            return logits, logits
        return logits, self.personal_model(x)
