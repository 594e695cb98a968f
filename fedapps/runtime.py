"""What the ServerApp and the ClientApp both derive from a run: config, model, device, seeds."""

from __future__ import annotations

import random
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from clients.base import TrainSettings
from fedapps.data import DATASETS
from fedapps.registry import make_model
from fedapps.tasks import Task, get_task
from fedapps.validation import resolve_config

__all__ = ["config_from_run", "dataset_task", "make_model", "run_dir", "seed_everything",
           "select_device", "train_settings"]  # make_model: now in fedapps.registry


@lru_cache(maxsize=8)
def _resolved(experiment: str, overrides: str) -> DictConfig:
    return resolve_config(experiment, overrides, check_data=False)  # nodes check their data


def config_from_run(run_config: Mapping[str, Any]) -> DictConfig:
    """The validated experiment config named by Flower's run config (cached per process)."""
    cfg = _resolved(str(run_config.get("experiment", "quickstart")),
                    str(run_config.get("overrides", "")))
    cfg = cfg.copy()
    if run_config.get("output-dir"):
        cfg.output["output-dir"] = str(run_config["output-dir"])
    if run_config.get("run-name"):
        cfg.output["run-name"] = str(run_config["run-name"])
    return cfg


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def select_device(cfg: DictConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(cfg.device)


def dataset_task(cfg: DictConfig) -> Task:
    """The learning task the dataset declares (classification unless it says otherwise)."""
    return get_task(str(getattr(DATASETS[cfg.dataset], "task", "classification")))


def train_settings(cfg: DictConfig) -> TrainSettings:
    t = cfg.train
    epochs = float(t["local-epochs"])  # a fraction: a step budget (clients/base.py)
    return TrainSettings(int(epochs) if epochs.is_integer() else epochs, int(t["batch-size"]),
                         float(t.lr),
                         float(t.momentum), float(t["weight-decay"]), int(cfg.seed),
                         tuple(int(m) for m in t["lr-milestones"]), float(t["lr-decay"]),
                         str(t.get("precision", "fp32")),
                         str(t.get("optimizer-state", "reset")),
                         str(cfg.eval.get("personal", "algorithm")))


def run_dir(cfg: DictConfig) -> Path:
    return Path(str(cfg.output["output-dir"])).expanduser().resolve() / str(cfg.output["run-name"])
