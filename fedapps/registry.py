"""Algorithm name -> (Strategy class, NumPyClient class, settings class, client data, model).

Adding an algorithm = a Strategy in strategies/ (or an existing one), a client and its settings
dataclass in clients/<name>.py, a one-line preset in conf/algorithm/ and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from clients.base import BaseClient
from clients.ditto import DittoClient, DittoSettings
from clients.fedavg import FedAvgClient
from clients.fedbabu import FedBabuClient, FedBabuSettings
from clients.feddyn import FedDynClient, FedDynSettings
from clients.fednova import FedNovaClient, FedNovaSettings
from clients.fedper import FedPerClient, FedPerSettings
from clients.fedprox import FedProxClient, FedProxSettings
from clients.fedreb import FedRebClient, FedRebSettings
from clients.fedrep import FedRepClient, FedRepSettings
from clients.fedrod import FedRodClient
from clients.gpfl import GpflClient, GpflSettings
from clients.local import LocalClient
from clients.partial import PartialClient, PartialSettings
from clients.peer import PeerClient
from clients.phaseshift import PhaseShiftClient, PhaseShiftSettings
from fedapps.data import DATASETS, FederatedData, apply_transforms, federated_data
from fedapps.models import GpflNet, PreResNet18, SplitNet, WidthCNN, build_model, frozen_names
from fedapps.settings import AlgoSettings, build_settings
from strategies.base import BaseStrategy
from strategies.fedavg import FedAvg
from strategies.fedcyclic import FedCyclic, FedCyclicSettings
from strategies.feddyn import FedDyn
from strategies.fednova import FedNova
from strategies.fedprox import FedProx
from strategies.fedreb import FedReb
from strategies.fedstar import FedStar, FedStarSettings
from strategies.local import Local
from strategies.partial import FedDropout, FedRolex, HeteroFL
from strategies.phaseshift import PhaseShift
from strategies.ringfed import RingFed, RingFedSettings


def make_model(cfg: DictConfig) -> SplitNet:
    """The experiment's model, initialised from the experiment seed (same on every process)."""
    info = DATASETS[cfg.dataset]
    torch.manual_seed(int(cfg.seed))
    outputs = info.num_classes or 1  # a regression model predicts one standardized value
    return build_model(cfg.model.name, info.shape, outputs, int(cfg.model["head-depth"]),
                       pretrained=bool(cfg.model.get("pretrained", False)),
                       freeze_features=bool(cfg.model.get("freeze-features", True)),
                       vocab_size=info.vocab_size)


@dataclass(frozen=True)
class Algorithm:
    strategy: type[BaseStrategy]
    client: type[BaseClient]
    settings: type[AlgoSettings] = AlgoSettings  # the algo.* keys, their rules and defaults
    transforms: tuple[str, ...] = ()  # per-client data transforms it needs, prepended
    model: Callable[[DictConfig], torch.nn.Module] = make_model
    # extra constructor arguments of the strategy (given the global model) and of the client
    strategy_kwargs: Callable[[DictConfig, torch.nn.Module], dict[str, Any]] = \
        lambda cfg, model: {}
    client_kwargs: Callable[[DictConfig], dict[str, Any]] = lambda cfg: {}
    official_test: bool = False  # also evaluate the global model on the official test split
    # dataset tasks the algorithm is defined for (class-based methods: classification only)
    tasks: tuple[str, ...] = ("classification", "regression")
    # train.optimizer-state persist allowed: the client keeps its optimizers' state between
    # participations (clients/base.py `sgd(keep=...)`); None allows it, else why not
    no_persistent_optimizer: str | None = None

    @property
    def personal_is_global(self) -> bool:
        """Whether the client's P is its global model (it keeps BaseClient.predict): the
        algorithms eval.personal local-previous applies to."""
        return self.client.predict is BaseClient.predict

    def client_data(self, cfg: DictConfig, fd: FederatedData, partition_id: int,
                    device: str) -> Any:
        """The client's local data after data.transforms (and this algorithm's)."""
        return apply_transforms(cfg, fd, partition_id, device, self.transforms)


def _width_model(cfg: DictConfig, beta: float = 1.0) -> torch.nn.Module:
    """The global model (beta 1) or a client's sub-model of the partial-training methods."""
    info = DATASETS[cfg.dataset]
    algo = algo_settings(cfg)
    assert isinstance(algo, PartialSettings)
    torch.manual_seed(int(cfg.seed))
    cls = PreResNet18 if algo.model == "preresnet18" else WidthCNN
    return cls(info.shape[0], info.num_classes, algo.hidden, beta=beta)


def _partial_kwargs(cfg: DictConfig, model: Any) -> dict[str, Any]:
    """The index groups (per width, or per layer for feddropout's algo.random-draw=per-layer)
    and, for label-masked classifier rows, the classes each client trains on."""
    per_layer = getattr(algo_settings(cfg), "random_draw", "per-width") == "per-layer"
    specs, widths = model.layer_groups() if per_layer else \
        (model.param_groups(), model.group_widths())
    return {"specs": specs, "widths": widths,
            "train_classes": (federated_data(cfg).counts("train") > 0).tolist()}


PARTIAL = {
    "settings": PartialSettings,
    "model": _width_model,
    "strategy_kwargs": _partial_kwargs,
    "client_kwargs": lambda cfg: {"model_factory": lambda beta: _width_model(cfg, beta)},
    "official_test": True,
    "tasks": ("classification",),  # image width models with a class head
    # the FedRolex/HeteroFL code builds its optimizer per round, and a client's sub-model
    # changes shape from round to round: momentum has nothing to carry over to
    "no_persistent_optimizer": "sub-models change shape between rounds",
}


def _gpfl_model(cfg: DictConfig) -> torch.nn.Module:
    net = make_model(cfg)  # seeds the initialisation; the extra modules follow deterministically
    return GpflNet(net, DATASETS[cfg.dataset].num_classes)


CLASSES = ("classification",)
# FedAvg (and FedOPT, its server optimizer) also trains detectors: seed 004's VisDrone row
WITH_DETECTION = ("classification", "regression", "detection")
# the periodic peer methods leave frozen parameters out of their traffic (exchange: trainable)
PEER = {"strategy_kwargs": lambda cfg, model: {"frozen": frozen_names(model)}}
FEDREB = Algorithm(FedReb, FedRebClient, FedRebSettings, transforms=("rebalance",),
                   tasks=CLASSES)

ALGORITHMS: dict[str, Algorithm] = {
    "fedavg": Algorithm(FedAvg, FedAvgClient, tasks=WITH_DETECTION),
    "fedprox": Algorithm(FedProx, FedProxClient, FedProxSettings),
    "fednova": Algorithm(FedNova, FedNovaClient, FedNovaSettings,  # seed 002 baseline
                         strategy_kwargs=lambda cfg, model: {
                             "parameter_names": {n for n, _ in model.named_parameters()}},
                         no_persistent_optimizer="its normalizer a_i assumes momentum "
                                                 "restarts at 0 every round"),
    "feddyn": Algorithm(FedDyn, FedDynClient, FedDynSettings),
    "ditto": Algorithm(FedAvg, DittoClient, DittoSettings),
    "fedper": Algorithm(FedAvg, FedPerClient, FedPerSettings),
    "fedrep": Algorithm(FedAvg, FedRepClient, FedRepSettings),
    "fedbabu": Algorithm(FedAvg, FedBabuClient, FedBabuSettings),
    "fedrod": Algorithm(FedAvg, FedRodClient, tasks=CLASSES),  # balanced softmax
    "fedrolex": Algorithm(FedRolex, PartialClient, **PARTIAL),
    "heterofl": Algorithm(HeteroFL, PartialClient, **PARTIAL),
    "feddropout": Algorithm(FedDropout, PartialClient, **PARTIAL),
    "gpfl": Algorithm(FedAvg, GpflClient, GpflSettings, model=_gpfl_model, tasks=CLASSES),
    "fedcyclic": Algorithm(FedCyclic, FedAvgClient, FedCyclicSettings),  # seed 003, relay
    "phase-shift": Algorithm(PhaseShift, PhaseShiftClient, PhaseShiftSettings),  # seed 002
    "local": Algorithm(Local, LocalClient),  # seed 003 baseline: local models, no sharing
    # seed 003, P periods of peer pre-aggregation; Fed-Star scores peers by accuracy
    "fedstar": Algorithm(FedStar, PeerClient, FedStarSettings, tasks=CLASSES, **PEER),
    "ringfed": Algorithm(RingFed, PeerClient, RingFedSettings, **PEER),
    "fedreb": FEDREB,  # seed 000 (client-scope threshold)
    "fedreg": FEDREB,  # seed 001 (global-scope threshold); same code, other preset
}


def algo_settings(cfg: DictConfig) -> AlgoSettings:
    """The run's typed algorithm settings from `cfg.algo` (raises ConfigError when invalid)."""
    algo = cfg.get("algo")
    plain = OmegaConf.to_container(algo, resolve=True) if isinstance(algo, DictConfig) else algo
    return build_settings(ALGORITHMS[cfg.algorithm].settings, plain)
