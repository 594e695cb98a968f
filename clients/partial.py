"""Client of the model-heterogeneous methods: builds its model at the capacity beta the server
sends, trains it (optionally with the label-masked classifier of the HeteroFL code) and uploads
it; evaluation uses the full global model.

With `label-mask`, seed 004's "local accuracy" is the P column: the full global model's argmax
restricted to the client's own classes, as the HeteroFL/FedRolex code evaluates it. G stays the
unmasked accuracy on the same local test split; the official test split gives global accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from clients.arrays import set_arrays
from clients.base import BaseClient
from clients.flops import forward_flops
from fedapps.config import dataset_defaults
from fedapps.errors import ConfigError
from fedapps.settings import AlgoSettings, setting

WIDTH_MODELS = ("width-cnn", "preresnet18")  # fedapps.registry._width_model builds them


@dataclass(frozen=True)
class PartialSettings(AlgoSettings):
    """FedRolex / HeteroFL / Federated Dropout (seed 004): the global model and how clients'
    capacities are drawn and weighted."""

    model: str = setting("width-cnn", choices=WIDTH_MODELS)
    hidden: tuple[int, ...] = setting((32, 64, 128), ge=1, what="channel counts")  # full model
    capacity: str = setting("uniform", choices=("uniform", "rho", "income"))
    levels: tuple[float, ...] = setting((1.0, 0.5, 0.25, 0.125, 0.0625), gt=0, le=1,
                                        what="capacities")
    rho: float = setting(0.5, ge=0)  # capacity rho: share of clients at the largest level
    assignment: str = setting("dynamic", choices=("dynamic", "fixed"))  # redrawn every round?
    server_scale: float = setting(1.0, ge=1)  # gamma: global width over the largest client's
    # Table 3.4 as the FedRolex code defines it (strategies/partial.py): conv kernels weighted
    # by the layer's local width / the entry's update count / both; none = equal (eq. 3.10)
    weighting: str = setting("none", choices=("none", "model-size", "model-update", "hybrid"))
    # masked CE (absent classes' logits set to 0, as the HeteroFL/FedRolex code), classifier
    # rows averaged over the clients holding the class; P = accuracy over the client's classes
    label_mask: bool = setting(False)
    # gradient-norm clipping of every local step (the FedRolex/HeteroFL code's
    # clip_grad_norm_(.., 1)); 0: none
    clip_grad_norm: float = setting(1.0, ge=0)
    roll: str = setting("forward", choices=("forward", "backward"))  # fedrolex's window
    # direction: forward = eq. 3.4 (start j mod K); backward = the FedRolex code ((-j) mod K)
    # feddropout's subsets: per-width (one draw per layer width, shared by the layers of that
    # width, so a residual addition adds the same channels on both sides: DECISIONS, A15) or
    # per-layer (every conv its own draw, as the FedRolex/HeteroFL code's randperm per layer)
    random_draw: str = setting("per-width", choices=("per-width", "per-layer"))

    def check_run(self, cfg: Any) -> None:
        """These methods build their own width models (algo.model, algo.hidden), so a model.*
        value other than the dataset's would be silently ignored: refuse it."""
        if self.random_draw != "per-width" and cfg.algorithm != "feddropout":
            raise ConfigError(f"algo.random-draw={self.random_draw!r}: only feddropout draws "
                              f"random subsets ({cfg.algorithm} does not)")
        implied = dataset_defaults(str(cfg.dataset)).model
        for key, value in cfg.model.items():
            if value != implied.get(key):
                raise ConfigError(
                    f"model.{key}={value!r}: {cfg.algorithm} builds its own model and ignores "
                    f"model.*; choose it with algo.model (allowed: {', '.join(WIDTH_MODELS)})"
                    " and algo.hidden")


class PartialClient(BaseClient):
    algo: PartialSettings

    def __init__(self, *args: Any, model_factory: Callable[[float], nn.Module],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_factory = model_factory
        self.beta = 1.0

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]):
        self.beta = float(config.get("beta", 1.0))
        self.model = self.model_factory(self.beta).to(self.device)
        return super().fit(parameters, config)

    def load_global(self, parameters: list[np.ndarray]) -> None:
        set_arrays(self.model, parameters)

    def clip_grad_norm(self) -> float | None:
        return self.algo.clip_grad_norm or None

    @property
    def label_mask(self) -> bool:
        return self.algo.label_mask

    def absent_classes(self) -> torch.Tensor:
        """Boolean mask of the classes missing from this client's training data."""
        classes = self.model.classifier.out_features
        return (torch.bincount(self.data.y_train, minlength=classes) == 0).to(self.device)

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """P with label-mask: the reference's forward (models/resnet.py, conv.py) masks in its
        local evaluation as in training, `out.masked_fill(label_mask == 0, 0)`: an absent
        class keeps a logit of 0 and wins where every held class's logit is negative."""
        logits = self.model(x)
        if not self.label_mask:
            return logits, logits
        return logits, logits.masked_fill(self.absent_classes(), 0.0)

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        loss_fn = self.task_loss(self.model)
        if self.label_mask:
            absent = self.absent_classes()

            def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                # the reference's `output.masked_fill(label_mask == 0, 0)`: absent classes keep
                # a logit of 0, so they still add e^0 to the softmax's denominator
                return F.cross_entropy(self.model(x).masked_fill(absent, 0.0), y)

        loss = self.sgd_epochs(self.model.parameters(), loss_fn, self.settings.local_epochs)
        return {"train-loss": loss, "beta": self.beta,
                "params": int(sum(p.numel() for p in self.model.parameters())),
                "flops": forward_flops(self.model, tuple(self.data.x_train.shape[1:]))}
