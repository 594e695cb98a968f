"""Local-model baseline (seed 003 Table 5.8 "Local Model"): every client trains its own model
alone; nothing is shared.

The local model lives in the node state (save_state / load_state, so a restarted SuperNode
resumes it) and starts as the seeded initial model every process builds. Training messages
carry no arrays either way: the client ignores the server's model and the server has nothing
to aggregate, so sending models would only inflate the traffic figures (which stay 0). P is
the local model on the client's local test split; G is the global model the server sends for
evaluation, which is the never-trained initial model (chance level): it is kept, not None, so
that the results contract stays the same for every algorithm, and is documented as such.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clients.arrays import get_arrays, set_arrays
from clients.base import BaseClient

STATE = "local-model"


class LocalClient(BaseClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.local = self.persistent_copy(self.model, STATE)

    def load_global(self, parameters: list[np.ndarray]) -> None:
        """Only evaluation sends a model (the untrained global one, for G)."""
        if parameters:
            set_arrays(self.model, parameters)

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        self.local.train()
        loss = self.sgd_epochs(self.local.parameters(), self.task_loss(self.local),
                               self.settings.local_epochs, keep="local")
        self.save_state(STATE, get_arrays(self.local))
        return {"train-loss": loss}

    def upload(self) -> list[np.ndarray]:
        return []  # nothing is aggregated

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.local.eval()
        return self.model(x), self.local(x)
