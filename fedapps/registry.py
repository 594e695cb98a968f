"""Algorithm name -> (Strategy class, NumPyClient class, config check, client data).

Adding an algorithm = a Strategy in strategies/, a client in clients/, a YAML file in
conf/algorithm/ and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from clients.base import BaseClient
from clients.fedavg import FedAvgClient
from clients.fedreb import FedRebClient
from fedapps.config import ConfigError
from fedapps.data import FederatedData, rebalance
from strategies.base import BaseStrategy
from strategies.fedavg import FedAvg
from strategies.fedreb import FedReb


def _no_extra_keys(cfg: DictConfig) -> None:
    """Algorithms without algorithm-specific keys need no extra validation."""


def _plain_data(cfg: DictConfig, fd: FederatedData, partition_id: int, device: str) -> Any:
    return fd.client(partition_id, device)


def _choices(cfg: DictConfig, allowed: dict[str, tuple[str, ...]]) -> None:
    for key, values in allowed.items():
        value = cfg.algo[key]
        if value not in values:
            raise ConfigError(f"algo.{key}={value!r}: allowed: {', '.join(values)}")


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
    client_data: Callable[[DictConfig, FederatedData, int, str], Any] = _plain_data


FEDREB = Algorithm(FedReb, FedRebClient, _validate_fedreb, rebalance.client_data)

ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm(FedAvg, FedAvgClient),
    "fedreb": FEDREB,  # seed 000 (client-scope threshold)
    "fedreg": FEDREB,  # seed 001 (global-scope threshold); same code, other preset
}
