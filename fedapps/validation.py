"""Validation of a loaded config: every value checked before any process starts.

Kept apart from fedapps.config (loading only) because it needs the registry (algorithm names
and settings classes), the datasets and the models, which import torch and Flower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedapps import data as fdata
from fedapps import yolo
from fedapps.config import load_config
from fedapps.data.partition import cluster_weights_needed
from fedapps.errors import ConfigError
from fedapps.iot_models import TOKEN_MODELS
from fedapps.models import (
    DETECTION_MODELS,
    IMAGE_MODELS,
    IOT_INPUT_RANKS,
    MODELS,
    PRETRAINED_MODELS,
    fc_depth,
)
from fedapps.paths import data_root
from fedapps.precision import PRECISIONS
from fedapps.pretrained import check_vgg19_weights
from fedapps.registry import ALGORITHMS, algo_settings
from fedapps.settings import as_dict
from strategies.server_opt import validate_server_settings

POOLS = ("merged", "official")
DEVICES = ("auto", "cpu", "cuda")
WANDB_MODES = ("offline", "online", "disabled")
CENTRAL_DATA = ("clients", "official")  # what `fedapps centralized` trains on
OPTIMIZER_STATES = ("reset", "persist")  # train.optimizer-state
PERSONAL_EVALS = ("algorithm", "local-previous")  # eval.personal


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


def is_plain_name(name: str) -> bool:
    """A run name names one folder inside output.output-dir: `..`, `a/b` or an absolute path
    would put results (and client state) elsewhere; a leading '.' could take the name of
    `.client-state`."""
    return bool(name) and not name.startswith(".") and not any(c in name for c in "/\\\0")


def resolve_config(experiment: str, overrides: str | Sequence[str] | None = None,
                   check_data: bool = True) -> DictConfig:
    """Load, validate and complete one run's config (algo defaults filled in): what a run,
    `fedapps validate` and the results' config.yaml see. fedapps.config.load_config alone
    only merges the YAML files, so its `algo` holds the keys that were set, no defaults."""
    cfg = load_config(experiment, overrides)
    validate(cfg, check_data)
    return cfg


def validate(cfg: DictConfig, check_data: bool = True) -> None:
    """Check every value before any process starts; raises ConfigError with a one-line message.

    Also completes `cfg.algo` with the settings dataclass's defaults (in place), so that what
    `fedapps validate` prints and what results record as config.yaml names every algo key."""
    _choice(cfg, "algorithm", sorted(ALGORITHMS))
    # first, so that everything below (e.g. the rebalance transform's algo.* parameters) and
    # everything after validation reads the complete algo section
    cfg.algo = as_dict(algo_settings(cfg))
    dataset = _choice(cfg, "dataset", sorted(fdata.DATASETS))
    task = fdata.DATASETS[dataset].task
    tasks = ALGORITHMS[cfg.algorithm].tasks
    _require(task in tasks, "algorithm", cfg.algorithm,
             f"needs a {' or '.join(tasks)} dataset; {dataset} is {task}")
    _choice(cfg, "device", DEVICES)
    _integer(cfg, "seed", 0)
    _integer(cfg, "rounds", 1)

    _choice(cfg, "data.pool", POOLS)
    fdata.validate_partition_settings(cfg)
    fdata.validate_transform_settings(cfg, ALGORITHMS[cfg.algorithm].transforms,
                                      check_files=check_data)
    tf = _number(cfg, "data.test-fraction")
    official = cfg.eval.get("official-test")
    _require(official is None or isinstance(official, bool), "eval.official-test", official,
             "must be true, false or null")
    _require(0 <= tf < 1, "data.test-fraction", tf, "must be in [0, 1)")
    local_test = _choice(cfg, "data.local-test", fdata.LOCAL_TESTS)
    _require(local_test == "split" or cfg.data.pool == "official", "data.local-test",
             local_test, "needs data.pool=official (clients test on the official test split)")
    _require(local_test == "split" or task == "classification", "data.local-test",
             local_test, f"needs class labels; dataset {dataset} is {task}")
    _require(tf > 0 or official is True or local_test != "split", "data.test-fraction", tf,
             "0 leaves clients no local test split: set eval.official-test=true (the global "
             "model is then evaluated on the official test split only)")
    _require(official is not True or cfg.data.pool == "official", "eval.official-test",
             official, "needs data.pool=official (with the merged pool the official test "
                       "samples are in the clients' training data)")

    n = _integer(cfg, "federation.num-clients", 1)
    frac = _number(cfg, "federation.fraction-fit")
    _require(0 < frac <= 1, "federation.fraction-fit", frac, "must be in (0, 1]")
    if cfg.federation["clients-per-round"] is not None:
        k = _integer(cfg, "federation.clients-per-round", 1)
        _require(k <= n, "federation.clients-per-round", k,
                 f"must be <= federation.num-clients ({n})")
    algo_settings(cfg).check_run(cfg)  # algo keys that depend on the federation
    mff = _number(cfg, "federation.min-fit-fraction")
    _require(0 < mff <= 1, "federation.min-fit-fraction", mff, "must be in (0, 1]")
    _choice(cfg, "federation.on-too-few", ("stop", "skip"))
    if cfg.federation["max-update-norm"] is not None:
        norm = _number(cfg, "federation.max-update-norm")
        _require(norm > 0, "federation.max-update-norm", norm, "must be > 0 or null")
    if cfg.federation["round-timeout"] is not None:
        timeout = _number(cfg, "federation.round-timeout")
        _require(timeout > 0, "federation.round-timeout", timeout, "must be > 0 or null")

    model = _choice(cfg, "model.name", sorted(MODELS))
    shape = tuple(fdata.DATASETS[dataset].shape)
    _require(model not in IMAGE_MODELS or len(shape) == 3, "model.name", model,
             f"a convolutional model needs [C, H, W] inputs; {dataset} gives {list(shape)} "
             "(use mlp)")
    rank = IOT_INPUT_RANKS.get(model, len(shape))
    _require(len(shape) == rank, "model.name", model,
             f"takes {rank}-d samples; {dataset} gives {list(shape)}")
    _require((model in DETECTION_MODELS) == (task == "detection"), "model.name", model,
             f"{dataset} is a detection dataset: use {', '.join(DETECTION_MODELS)}"
             if task == "detection" else f"is a detector; {dataset} is {task}")
    _require(model not in DETECTION_MODELS or yolo.ultralytics_installed(), "model.name", model,
             f"needs Ultralytics: {yolo.INSTALL}")
    vocab = fdata.DATASETS[dataset].vocab_size
    _require((model in TOKEN_MODELS) == (vocab is not None), "model.name", model,
             f"{dataset} gives token ids (vocabulary {vocab}): use {', '.join(TOKEN_MODELS)}"
             if vocab is not None else f"embeds token ids; {dataset} has no vocabulary")
    pretrained = cfg.model.get("pretrained", False)
    _require(isinstance(pretrained, bool), "model.pretrained", pretrained,
             "must be true or false")
    _require(not pretrained or model in PRETRAINED_MODELS, "model.pretrained", pretrained,
             f"only {', '.join(PRETRAINED_MODELS)} have pretrained weights")
    _require(isinstance(cfg.model.get("freeze-features", True), bool), "model.freeze-features",
             cfg.model.get("freeze-features"), "must be true or false")
    _require(model not in PRETRAINED_MODELS or (shape[0] == 3 and min(shape[1:]) >= 32),
             "model.name", model, f"VGG-19 needs [3, >=32, >=32] inputs; {dataset} gives "
             f"{list(shape)}")
    depth = _integer(cfg, "model.head-depth", 1)
    max_depth = fc_depth(model)
    _require(depth <= max_depth, "model.head-depth", depth,
             f"must be <= {max_depth} (FC layers of model {model})")

    epochs = _number(cfg, "train.local-epochs")
    _require(epochs > 0, "train.local-epochs", epochs,
             "must be > 0 (a fraction runs round(E x ceil(n/B)) minibatch steps)")
    if not float(epochs).is_integer() and cfg.algo.get("stage-order") == "interleaved":
        raise ConfigError(f"train.local-epochs={epochs!r}: FedReb's interleaved stages "
                          "alternate whole epochs; use a whole number or "
                          "algo.stage-order=sequential")
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
    _integer(cfg, "centralized.epochs", 1)
    if cfg.centralized.lr is not None:
        clr = _number(cfg, "centralized.lr")
        _require(clr > 0, "centralized.lr", clr, "must be > 0 or null (train.lr)")
    if cfg.centralized["batch-size"] is not None:
        _integer(cfg, "centralized.batch-size", 1)
    _choice(cfg, "centralized.train-data", CENTRAL_DATA)
    _choice(cfg, "train.precision", PRECISIONS)  # what this machine supports: preflight
    spec = ALGORITHMS[cfg.algorithm]
    state = _choice(cfg, "train.optimizer-state", OPTIMIZER_STATES)
    _require(state == "reset" or spec.no_persistent_optimizer is None, "train.optimizer-state",
             state, f"{cfg.algorithm} needs reset ({spec.no_persistent_optimizer})")
    personal = _choice(cfg, "eval.personal", PERSONAL_EVALS)
    _require(personal == "algorithm" or spec.personal_is_global, "eval.personal", personal,
             f"only for algorithms whose P is the global model (e.g. fedavg, fedprox, feddyn); "
             f"{cfg.algorithm} has a personalized model of its own")
    _integer(cfg, "eval.eval-every", 1)
    ef = _number(cfg, "eval.fraction")
    _require(0 < ef <= 1, "eval.fraction", ef, "must be in (0, 1]")
    _require(isinstance(cfg.eval["allow-partial"], bool), "eval.allow-partial",
             cfg.eval["allow-partial"], "must be true or false")
    _choice(cfg, "wandb.mode", WANDB_MODES)
    name = cfg.output["run-name"]
    _require(name is None or is_plain_name(str(name)), "output.run-name", name,
             "must be a plain folder name (not empty, no '/' or '\\', not starting with '.')")
    try:
        validate_server_settings(cfg.server)
    except ValueError as err:
        raise ConfigError(str(err)) from None

    if check_data:
        fdata.check_available(dataset, data_root(cfg), bool(cfg.data.download))
        if pretrained:  # the weights are data too: present and the published file
            check_vgg19_weights()
        if cluster_weights_needed(cfg):
            check_vgg19_weights(None, "data.fedaiot.cluster-features=vgg19",
                                "set data.fedaiot.cluster-features=raw")
