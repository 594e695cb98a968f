"""Algorithm name -> (Strategy class, NumPyClient class, config check).

Adding an algorithm = a Strategy in strategies/, a client in clients/, a YAML file in
conf/algorithm/ and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig

from clients.base import BaseClient
from clients.fedavg import FedAvgClient
from strategies.base import BaseStrategy
from strategies.fedavg import FedAvg


def _no_extra_keys(cfg: DictConfig) -> None:
    """Algorithms without algorithm-specific keys need no extra validation."""


@dataclass(frozen=True)
class Algorithm:
    strategy: type[BaseStrategy]
    client: type[BaseClient]
    validate: Callable[[DictConfig], None] = _no_extra_keys


ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm(FedAvg, FedAvgClient),
}
