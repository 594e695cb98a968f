"""Algorithm name -> (Strategy class, NumPyClient class, config check, client data).

Adding an algorithm = a Strategy in strategies/, a client in clients/, a YAML file in
conf/algorithm/ and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig

from clients.base import BaseClient
from clients.ditto import DittoClient
from clients.fedavg import FedAvgClient
from clients.fedbabu import FedBabuClient
from clients.feddyn import FedDynClient
from clients.fedper import FedPerClient
from clients.fedprox import FedProxClient
from clients.fedreb import FedRebClient
from clients.fedrep import FedRepClient
from clients.fedrod import FedRodClient
from clients.gpfl import GpflClient
from clients.partial import PartialClient
from fedapps.config import ConfigError
from fedapps.data import DATASETS, FederatedData, apply_transforms, rebalance
from fedapps.models import GpflNet, PreResNet18, WidthCNN
from fedapps.runtime import make_model
from strategies.base import BaseStrategy
from strategies.fedavg import FedAvg
from strategies.feddyn import FedDyn
from strategies.fedreb import FedReb
from strategies.partial import FedDropout, FedRolex, HeteroFL


def _no_extra_keys(cfg: DictConfig) -> None:
    """Algorithms without algorithm-specific keys need no extra validation."""


def _choices(cfg: DictConfig, allowed: dict[str, tuple[str, ...]]) -> None:
    for key, values in allowed.items():
        value = cfg.algo[key]
        if value not in values:
            raise ConfigError(f"algo.{key}={value!r}: allowed: {', '.join(values)}")


def _numbers(cfg: DictConfig, rules: dict[str, tuple[str, float]]) -> None:
    """rules: key -> ('>' or '>=', bound); integers where the key ends in 'epochs'."""
    for key, (op, bound) in rules.items():
        value = cfg.algo[key]
        is_num = isinstance(value, int | float) and not isinstance(value, bool)
        if key.endswith("epochs") and not isinstance(value, int):
            is_num = False
        ok = is_num and (value > bound if op == ">" else value >= bound)
        if not ok:
            kind = "an integer" if key.endswith("epochs") else "a number"
            raise ConfigError(f"algo.{key}={value!r}: must be {kind} {op} {bound:g}")


def _validated(numbers: dict[str, tuple[str, float]], shared: bool = False
               ) -> Callable[[DictConfig], None]:
    def check(cfg: DictConfig) -> None:
        _numbers(cfg, numbers)
        if shared:
            _choices(cfg, {"shared-prefix": ("", "base.")})
    return check


def _validate_fedreb(cfg: DictConfig) -> None:
    _choices(cfg, {"scope": rebalance.SCOPES, "threshold": rebalance.THRESHOLDS,
                   "augmentation": rebalance.AUGMENTATIONS,
                   "stage-order": ("interleaved", "sequential"),
                   "aggregation": ("split", "origin"), "ablation": ("none", "a", "b", "c", "d")})


@dataclass(frozen=True)
class Algorithm:
    strategy: type[BaseStrategy]
    client: type[BaseClient]
    validate: Callable[[DictConfig], None] = _no_extra_keys
    transforms: tuple[str, ...] = ()  # per-client data transforms it needs, prepended
    model: Callable[[DictConfig], torch.nn.Module] = make_model
    # extra constructor arguments of the strategy (given the global model) and of the client
    strategy_kwargs: Callable[[DictConfig, torch.nn.Module], dict[str, Any]] = \
        lambda cfg, model: {}
    client_kwargs: Callable[[DictConfig], dict[str, Any]] = lambda cfg: {}
    official_test: bool = False  # also evaluate the global model on the official test split

    def client_data(self, cfg: DictConfig, fd: FederatedData, partition_id: int,
                    device: str) -> Any:
        """The client's local data after data.transforms (and this algorithm's)."""
        return apply_transforms(cfg, fd, partition_id, device, self.transforms)


def _width_model(cfg: DictConfig, beta: float = 1.0) -> torch.nn.Module:
    """The global model (beta 1) or a client's sub-model of the partial-training methods."""
    info = DATASETS[cfg.dataset]
    torch.manual_seed(int(cfg.seed))
    cls = PreResNet18 if cfg.algo.model == "preresnet18" else WidthCNN
    return cls(info.shape[0], info.num_classes, tuple(int(h) for h in cfg.algo.hidden),
               beta=beta)


def _validate_partial(cfg: DictConfig) -> None:
    _choices(cfg, {"capacity": ("uniform", "rho", "income"),
                   "assignment": ("dynamic", "fixed"), "model": ("width-cnn", "preresnet18"),
                   "weighting": ("none", "model-size", "model-update", "hybrid")})
    levels = list(cfg.algo.levels)
    if not levels or any(not isinstance(b, int | float) or not 0 < b <= 1 for b in levels):
        raise ConfigError(f"algo.levels={levels}: capacities must be in (0, 1]")
    hidden = list(cfg.algo.hidden)
    if not hidden or any(not isinstance(h, int) or h < 1 for h in hidden):
        raise ConfigError(f"algo.hidden={hidden}: channel counts must be integers >= 1")
    _numbers(cfg, {"rho": (">=", 0), "server-scale": (">=", 1)})


PARTIAL = {
    "validate": _validate_partial,
    "model": _width_model,
    "strategy_kwargs": lambda cfg, model: {"specs": model.param_groups(),
                                           "widths": model.group_widths()},
    "client_kwargs": lambda cfg: {"model_factory": lambda beta: _width_model(cfg, beta)},
    "official_test": True,
}


def _gpfl_model(cfg: DictConfig) -> torch.nn.Module:
    net = make_model(cfg)  # seeds the initialisation; the extra modules follow deterministically
    return GpflNet(net, DATASETS[cfg.dataset].num_classes)


FEDREB = Algorithm(FedReb, FedRebClient, _validate_fedreb, transforms=("rebalance",))

ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm(FedAvg, FedAvgClient),
    "fedprox": Algorithm(FedAvg, FedProxClient, _validated({"mu": (">=", 0)})),
    "feddyn": Algorithm(FedDyn, FedDynClient, _validated({"alpha": (">", 0)})),
    "ditto": Algorithm(FedAvg, DittoClient, _validated({"lambda": (">=", 0),
                                                        "personal-epochs": (">=", 1)})),
    "fedper": Algorithm(FedAvg, FedPerClient, _validated({}, shared=True)),
    "fedrep": Algorithm(FedAvg, FedRepClient, _validated({"head-epochs": (">=", 1),
                                                          "base-epochs": (">=", 1)}, True)),
    "fedbabu": Algorithm(FedAvg, FedBabuClient, _validated({"finetune-epochs": (">=", 1)}, True)),
    "fedrod": Algorithm(FedAvg, FedRodClient),
    "fedrolex": Algorithm(FedRolex, PartialClient, **PARTIAL),
    "heterofl": Algorithm(HeteroFL, PartialClient, **PARTIAL),
    "feddropout": Algorithm(FedDropout, PartialClient, **PARTIAL),
    "gpfl": Algorithm(FedAvg, GpflClient, _validated({"lambda": (">=", 0), "eta": (">=", 0)}),
                      model=_gpfl_model),
    "fedreb": FEDREB,  # seed 000 (client-scope threshold)
    "fedreg": FEDREB,  # seed 001 (global-scope threshold); same code, other preset
}
