"""Experiment configuration: OmegaConf files in conf/, loaded and merged (nothing else).

Merge order: defaults < dataset < algorithm < experiment < overrides. Only keys declared in
the defaults or the dataset file may be set; anything else is a ConfigError naming the key, so a
typo never silently falls back to a default. `algo.*` keys are declared by the algorithm's
settings dataclass: fedapps.validation checks them and fills in their defaults. This module
imports no torch, data or registry code, so the CLI and every layer can load configs cheaply.
"""

from __future__ import annotations

import copy
import functools
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedapps.errors import ConfigError
from fedapps.paths import CONF_DIR, data_root

__all__ = ["CONF_DIR", "ConfigError", "available", "clients_per_round", "data_root",
           "dataset_defaults", "load_config", "override_key", "parse_overrides", "squash_overrides",
           "to_container"]

OPEN_SECTIONS = ("algo",)  # keys declared by the algorithm's settings class, not by YAML


def available(kind: str) -> list[str]:
    """Names of the YAML files in conf/<kind> (dataset, algorithm, experiment)."""
    return sorted(p.stem for p in (CONF_DIR / kind).glob("*.yaml"))


def _load_yaml(kind: str, name: str, key: str) -> dict[str, Any]:
    path = CONF_DIR / kind / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"{key}={name!r}: unknown {kind}; allowed: {', '.join(available(kind))}")
    return _yaml_file(path)


def _yaml_file(path: Path) -> dict[str, Any]:
    """A YAML file as plain nested dicts, interpolations left as written; parsed once per
    process and version of the file (parsing and merging with OmegaConf took about 50 ms a
    config, docs/PERFORMANCE.md).
    The caller gets its own copy."""
    stat = path.stat()
    return copy.deepcopy(_parsed(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=256)
def _parsed(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert isinstance(raw, dict)
    return raw


def _merged(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """`update` merged into `base` as OmegaConf.merge merges untyped configs: mappings key by
    key, any other value (lists too) replaced whole. Neither input is changed; values are
    shared, not copied (the inputs are this call's own copies, and OmegaConf.create copies)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def parse_overrides(overrides: str | Sequence[str] | None) -> list[str]:
    """Accept 'a=1 b.c=2' (one string, as Flower's run config carries it) or ['a=1', 'b.c=2']."""
    if not overrides:
        return []
    items = shlex.split(overrides) if isinstance(overrides, str) else list(overrides)
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value")
    return items


def override_key(item: str) -> str:
    """The dotted key of one `key=value` override."""
    return item.split("=", 1)[0].strip()


def squash_overrides(items: Sequence[str]) -> list[str]:
    """Each key once, with its last value (the one that wins), in the order the winners came:
    what a run records as its invocation, so that resuming it again does not pile up
    `output.run-name=...` and the other keys each resume sets."""
    keys = [override_key(item) for item in items]
    last = {key: i for i, key in enumerate(keys)}
    return [item for i, item in enumerate(items) if last[keys[i]] == i]


def _unknown_keys(base: Any, update: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """Dotted keys in `update` that `base` does not declare, with the keys it does declare."""
    if not isinstance(update, dict) or not isinstance(base, dict):
        return []
    unknown = []
    for key in update:
        dotted = f"{prefix}{key}"
        if key not in base:
            unknown.append((dotted, sorted(str(k) for k in base)))
        elif not prefix and key in OPEN_SECTIONS:
            continue  # checked against the settings dataclass by fedapps.validation
        else:
            unknown.extend(_unknown_keys(base[key], update[key], f"{dotted}."))
    return unknown


def load_config(experiment: str, overrides: str | Sequence[str] | None = None) -> DictConfig:
    """Resolve one run's configuration; raises ConfigError on unknown names or keys."""
    dotlist = parse_overrides(overrides)
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist(dotlist), resolve=False)
    except Exception as err:  # omegaconf raises several grammar errors
        raise ConfigError(f"overrides {dotlist}: {err}") from None
    assert isinstance(parsed, dict)
    override_cfg: dict[str, Any] = {str(k): v for k, v in parsed.items()}
    exp_name = str(override_cfg.pop("experiment", experiment))
    exp_cfg = _load_yaml("experiment", exp_name, "experiment")
    defaults = _yaml_file(CONF_DIR / "defaults.yaml")

    def choose(key: str) -> str:
        for source in (override_cfg, exp_cfg, defaults):
            if key in source:
                return str(source[key])
        raise ConfigError(f"{key}: not set")

    base = _merged(_merged(defaults, _load_yaml("dataset", choose("dataset"), "dataset")),
                   _load_yaml("algorithm", choose("algorithm"), "algorithm"))
    for layer in (exp_cfg, override_cfg):
        unknown = _unknown_keys(base, layer)
        if unknown:
            key, allowed = unknown[0]
            raise ConfigError(f"{key}: unknown key; allowed here: {', '.join(allowed)}")
        base = _merged(base, layer)
    base["experiment"] = exp_name
    return OmegaConf.create(base)


def dataset_defaults(dataset: str) -> DictConfig:
    """The config before the algorithm, experiment and overrides (defaults < dataset file):
    tells a value the user chose from one the dataset merely implies."""
    return OmegaConf.create(_merged(_yaml_file(CONF_DIR / "defaults.yaml"),
                                    _load_yaml("dataset", dataset, "dataset")))


def clients_per_round(cfg: DictConfig) -> int:
    """Clients trained per round: explicit count, else round(fraction * clients), at least 1."""
    fed = cfg.federation
    if fed["clients-per-round"] is not None:
        return int(fed["clients-per-round"])
    return max(1, round(float(fed["fraction-fit"]) * int(fed["num-clients"])))


def to_container(cfg: DictConfig | ListConfig) -> dict[str, Any]:
    """Plain dict of the resolved config (for results files and W&B)."""
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out
