"""Experiment configuration: OmegaConf files in conf/, merged and validated before anything runs.

Merge order: defaults < dataset < algorithm < experiment < overrides. Only keys declared in
the defaults, the dataset file or the algorithm file may be set; anything else is a ConfigError
naming the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

POOLS = ("merged", "official")
DEVICES = ("auto", "cpu", "cuda")
WANDB_MODES = ("offline", "online", "disabled")


class ConfigError(ValueError):
    """A bad configuration value: the message names the key and what is allowed."""


def available(kind: str) -> list[str]:
    """Names of the YAML files in conf/<kind> (dataset, algorithm, experiment)."""
    return sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))


def _load_yaml(kind: str, name: str, key: str) -> DictConfig:
    path = CONF_DIR / kind / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"{key}={name!r}: unknown {kind}; allowed: {', '.join(available(kind))}")
    cfg = OmegaConf.load(path)
    assert isinstance(cfg, DictConfig)
    return cfg


def parse_overrides(overrides: str | Sequence[str] | None) -> list[str]:
    """Accept 'a=1 b.c=2' (one string, as Flower's run config carries it) or ['a=1', 'b.c=2']."""
    if not overrides:
        return []
    items = shlex.split(overrides) if isinstance(overrides, str) else list(overrides)
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value")
    return items


def _unknown_keys(base: Any, update: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Dotted keys in `update` that `base` does not declare, with the keys it does declare."""
    if not isinstance(update, DictConfig) or not isinstance(base, DictConfig):
        return []
    unknown = []
    for key in update:
        dotted = f"{prefix}{key}"
        if key not in base:
            unknown.append((dotted, sorted(str(k) for k in base)))
        else:
            unknown.extend(_unknown_keys(base[key], update[key], f"{dotted}."))
    return unknown


def load_config(experiment: str, overrides: str | Sequence[str] | None = None) -> DictConfig:
    """Resolve one run's configuration; raises ConfigError on unknown names or keys."""
    dotlist = parse_overrides(overrides)
    try:
        override_cfg = OmegaConf.from_dotlist(dotlist)
    except Exception as err:  # omegaconf raises several grammar errors
        raise ConfigError(f"overrides {dotlist}: {err}") from None
    exp_name = override_cfg.pop("experiment", experiment)
    exp_cfg = _load_yaml("experiment", exp_name, "experiment")
    defaults = OmegaConf.load(CONF_DIR / "defaults.yaml")

    def choose(key: str) -> str:
        for source in (override_cfg, exp_cfg, defaults):
            if key in source:
                return str(source[key])
        raise ConfigError(f"{key}: not set")

    dataset_cfg = _load_yaml("dataset", choose("dataset"), "dataset")
    algorithm_cfg = _load_yaml("algorithm", choose("algorithm"), "algorithm")
    base = OmegaConf.merge(defaults, dataset_cfg, algorithm_cfg)
    for layer in (exp_cfg, override_cfg):
        unknown = _unknown_keys(base, layer)
        if unknown:
            key, allowed = unknown[0]
            raise ConfigError(f"{key}: unknown key; allowed here: {', '.join(allowed)}")
        base = OmegaConf.merge(base, layer)
    base.experiment = exp_name
    assert isinstance(base, DictConfig)
    return base


def data_root(cfg: DictConfig) -> Path:
    """The data root: config, then $FEDAPPS_DATA_ROOT, then ./data."""
    root = cfg.data["data-root"] or os.environ.get("FEDAPPS_DATA_ROOT") or "data"
    return Path(str(root)).expanduser().resolve()


def clients_per_round(cfg: DictConfig) -> int:
    """Clients trained per round: explicit count, else round(fraction * clients), at least 1."""
    fed = cfg.federation
    if fed["clients-per-round"] is not None:
        return int(fed["clients-per-round"])
    return max(1, round(float(fed["fraction-fit"]) * int(fed["num-clients"])))


def _require(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r}: {rule}")


def _number(cfg: DictConfig, key: str) -> Any:
    value = OmegaConf.select(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}={value!r}: must be a number")
    return value


def _integer(cfg: DictConfig, key: str, minimum: int) -> int:
    value = OmegaConf.select(cfg, key)
    is_int = isinstance(value, int) and not isinstance(value, bool)
    _require(is_int, key, value, "must be an integer")
    _require(value >= minimum, key, value, f"must be >= {minimum}")
    return int(value)


def _choice(cfg: DictConfig, key: str, allowed: Sequence[str]) -> str:
    value = OmegaConf.select(cfg, key)
    _require(value in allowed, key, value, f"allowed: {', '.join(allowed)}")
    return str(value)


def validate(cfg: DictConfig, check_data: bool = True) -> None:
    """Check every value before any process starts; raises ConfigError with a one-line message."""
    from fedapps import data as fdata
    from fedapps.models import MODELS, fc_depth
    from fedapps.registry import ALGORITHMS

    _choice(cfg, "algorithm", sorted(ALGORITHMS))
    dataset = _choice(cfg, "dataset", sorted(fdata.DATASETS))
    _choice(cfg, "device", DEVICES)
    _integer(cfg, "seed", 0)
    _integer(cfg, "rounds", 1)

    _choice(cfg, "data.pool", POOLS)
    fdata.validate_partition_settings(cfg)
    fdata.validate_transform_settings(cfg, ALGORITHMS[cfg.algorithm].transforms)
    tf = _number(cfg, "data.test-fraction")
    _require(0 < tf < 1, "data.test-fraction", tf, "must be in (0, 1)")

    n = _integer(cfg, "federation.num-clients", 1)
    frac = _number(cfg, "federation.fraction-fit")
    _require(0 < frac <= 1, "federation.fraction-fit", frac, "must be in (0, 1]")
    if cfg.federation["clients-per-round"] is not None:
        k = _integer(cfg, "federation.clients-per-round", 1)
        _require(k <= n, "federation.clients-per-round", k,
                 f"must be <= federation.num-clients ({n})")
    mff = _number(cfg, "federation.min-fit-fraction")
    _require(0 < mff <= 1, "federation.min-fit-fraction", mff, "must be in (0, 1]")
    _choice(cfg, "federation.on-too-few", ("stop", "skip"))
    if cfg.federation["round-timeout"] is not None:
        timeout = _number(cfg, "federation.round-timeout")
        _require(timeout > 0, "federation.round-timeout", timeout, "must be > 0 or null")

    model = _choice(cfg, "model.name", sorted(MODELS))
    depth = _integer(cfg, "model.head-depth", 1)
    max_depth = fc_depth(model)
    _require(depth <= max_depth, "model.head-depth", depth,
             f"must be <= {max_depth} (FC layers of model {model})")

    _integer(cfg, "train.local-epochs", 1)
    _integer(cfg, "train.batch-size", 1)
    lr = _number(cfg, "train.lr")
    _require(lr > 0, "train.lr", lr, "must be > 0")
    mom = _number(cfg, "train.momentum")
    _require(0 <= mom < 1, "train.momentum", mom, "must be in [0, 1)")
    wd = _number(cfg, "train.weight-decay")
    _require(wd >= 0, "train.weight-decay", wd, "must be >= 0")
    milestones = list(cfg.train["lr-milestones"])
    _require(all(isinstance(m, int) and m > 0 for m in milestones), "train.lr-milestones",
             milestones, "must be positive round numbers")
    decay = _number(cfg, "train.lr-decay")
    _require(0 < decay <= 1, "train.lr-decay", decay, "must be in (0, 1]")
    _integer(cfg, "eval.eval-every", 1)
    ef = _number(cfg, "eval.fraction")
    _require(0 < ef <= 1, "eval.fraction", ef, "must be in (0, 1]")
    _choice(cfg, "wandb.mode", WANDB_MODES)
    from strategies.server_opt import validate_server_settings

    try:
        validate_server_settings(cfg.server)
    except ValueError as err:
        raise ConfigError(str(err)) from None

    ALGORITHMS[cfg.algorithm].validate(cfg)
    if check_data:
        fdata.check_available(dataset, data_root(cfg), bool(cfg.data.download))


def to_container(cfg: DictConfig | ListConfig) -> dict[str, Any]:
    """Plain dict of the resolved config (for results files and W&B)."""
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out
