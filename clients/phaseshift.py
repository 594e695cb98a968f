"""Phase-shift client (seed 002 Alg. 3): its local model persists across rounds in the node
state (and `state-dir`, so a SuperNode keeps it), because a group trains for n rounds before it
uploads. The round plan's role says how to start: fresh from the server model, or the drift-
correction merge of the server model into the local model; only uploading roles send arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from clients.arrays import get_arrays, set_arrays
from clients.base import BaseClient
from fedapps.config import clients_per_round
from fedapps.errors import ConfigError
from fedapps.settings import AlgoSettings, setting
from strategies.phases import (
    FRESH,
    FRESH_RETURN,
    UPLOADING,
    drift_correction,
    epoch_scale,
    local_steps,
)

STATE = "phase-model"  # the client's local model between the rounds of its cycle


@dataclass(frozen=True)
class PhaseShiftSettings(AlgoSettings):
    """n phases; `mode` communication keeps E, epoch scales it by (n+1)/(2n) (eq. 4.3)."""

    phases: int = setting(4, ge=1)  # the thesis's best setting (Ch. 4); 1 = FedAvg
    mode: str = setting("communication", choices=("communication", "epoch"))

    def check_run(self, cfg: Any) -> None:
        """Every phase needs at least one of the round's active clients."""
        k = clients_per_round(cfg)
        if self.phases > k:
            raise ConfigError(f"algo.phases={self.phases}: must be <= the clients per round "
                              f"({k}, federation.clients-per-round or fraction-fit x "
                              "num-clients)")


class PhaseShiftClient(BaseClient):
    algo: PhaseShiftSettings
    role = FRESH_RETURN  # until a plan says otherwise (e.g. get_parameters): the whole model

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        """Start as the role says, train E x scale epochs as minibatch steps, keep the model
        when this group does not upload this round."""
        self.role = str(config.get("phase-role", FRESH_RETURN))
        lost = 0
        if self.role not in (FRESH, FRESH_RETURN):
            server_examples = int(config.get("phase-n", 0))
            local = self.load_state(STATE)
            if local is not None:
                set_arrays(self.model, drift_correction(get_arrays(self.model), local,
                                                        server_examples,
                                                        self.num_train_examples()))
            else:  # round 1 (N = 0: the local model is w_1, the received model) or a lost state
                lost = int(server_examples > 0)
        epochs = self.settings.local_epochs * epoch_scale(self.algo.phases, self.algo.mode)
        steps = local_steps(epochs, self.epoch_examples(), self.settings.batch_size)
        loss = self.sgd_epochs(self.model.parameters(), self.task_loss(self.model), 0,
                               steps=steps, keep="model")
        if self.role not in UPLOADING:
            self.save_state(STATE, get_arrays(self.model))
        return {"train-loss": loss, "phase-role": self.role, "local-steps": steps,
                "phase-state-lost": lost}

    def upload(self) -> list[np.ndarray]:
        """Only the returning group sends its model; the others answer with no arrays."""
        return super().upload() if self.role in UPLOADING else []
