import subprocess
import sys

import pytest

from fedapps.config import ConfigError, clients_per_round, load_config, validate


def check(*overrides, experiment="quickstart"):
    cfg = load_config(experiment, list(overrides))
    validate(cfg)
    return cfg


def test_merge_order_defaults_dataset_algorithm_experiment_overrides():
    cfg = load_config("quickstart", ["train.lr=0.2"])
    assert cfg.model.name == "digits-cnn"  # from conf/dataset/digits.yaml
    assert cfg.train["batch-size"] == 16  # dataset file over defaults (20)
    assert cfg.data.alpha == 0.5  # experiment over defaults (0.1)
    assert cfg.train.lr == 0.2  # override over experiment (0.05)
    assert cfg.train.momentum == 0.9  # defaults


def test_override_can_switch_dataset_and_pull_its_file():
    cfg = load_config("quickstart", ["dataset=fmnist"])
    assert cfg.dataset == "fmnist" and cfg.model.name == "convnet"


def test_clients_per_round():
    cfg = check("federation.num-clients=20", "federation.fraction-fit=0.25")
    assert clients_per_round(cfg) == 5
    assert clients_per_round(check("federation.clients-per-round=3")) == 3
    assert clients_per_round(check("federation.fraction-fit=0.01")) == 1


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=fedfoo"], "algorithm='fedfoo': unknown algorithm; allowed: ditto, fedavg,"),
    (["dataset=imagenet"], "dataset='imagenet': unknown dataset; allowed:"),
    (["data.alhpa=0.3"], "data.alhpa: unknown key; allowed here: alpha,"),
    (["nonsense=1"], "nonsense: unknown key"),
    (["data.alpha=0"], "data.alpha=0: must be > 0"),
    (["data.alpha=-1"], "data.alpha=-1: must be > 0"),
    (["federation.fraction-fit=0"], "federation.fraction-fit=0: must be in (0, 1]"),
    (["federation.fraction-fit=1.5"], "federation.fraction-fit=1.5: must be in (0, 1]"),
    (["federation.clients-per-round=11"],
     "federation.clients-per-round=11: must be <= federation.num-clients (10)"),
    (["model.head-depth=4"], "model.head-depth=4: must be <= 3 (FC layers of model digits-cnn)"),
    (["model.name=mlp", "model.head-depth=3"], "model.head-depth=3: must be <= 2"),
    (["model.name=resnet"], "model.name='resnet': allowed: convnet, digits-cnn, mlp"),
    (["data.partitioner=zipf"], "data.partitioner='zipf': allowed: dirichlet, iid, shards"),
    (["data.partitioner=shards", "data.labels-per-client=11"],
     "data.labels-per-client=11: must be <= 10"),
    (["data.test-fraction=1"], "data.test-fraction=1: must be in (0, 1)"),
    (["rounds=0"], "rounds=0: must be >= 1"),
    (["rounds=2.5"], "rounds=2.5: must be an integer"),
    (["train.lr=0"], "train.lr=0: must be > 0"),
    (["train.momentum=1"], "train.momentum=1: must be in [0, 1)"),
    (["wandb.mode=loud"], "wandb.mode='loud': allowed: offline, online, disabled"),
    (["device=tpu"], "device='tpu': allowed: auto, cpu, cuda"),
    (["eval.fraction=0"], "eval.fraction=0: must be in (0, 1]"),
    (["rounds"], "override 'rounds': expected key=value"),
    (["algorithm=fedrolex", "algo.weighting=size"],
     "algo.weighting='size': allowed: none, model-size, model-update, hybrid"),
    (["algorithm=heterofl", "algo.capacity=zipf"],
     "algo.capacity='zipf': allowed: uniform, rho, income"),
    (["algorithm=feddropout", "algo.levels=[1.5]"],
     "algo.levels=[1.5]: capacities must be in (0, 1]"),
])
def test_bad_values_name_the_key_and_what_is_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        check(*overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_experiment():
    with pytest.raises(ConfigError, match="experiment='nope': unknown experiment; allowed: "):
        load_config("nope")


def test_missing_data_names_dataset_and_root(tmp_path):
    with pytest.raises(ConfigError) as err:
        check("dataset=fmnist", f"data.data-root={tmp_path}")
    msg = str(err.value)
    assert "fmnist not found" in msg and str(tmp_path) in msg and "data.download" in msg


def test_cifar_absent_offline_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="dataset cifar10 not found"):
        check("dataset=cifar10", f"data.data-root={tmp_path}")


def test_cli_config_error_is_one_line_exit_2_without_starting_flower():
    proc = subprocess.run(
        [sys.executable, "-m", "fedapps.cli", "run", "quickstart", "--set", "data.alpha=-0.5"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fedapps: config error: data.alpha=-0.5: must be > 0"
    assert "SuperLink" not in proc.stdout + proc.stderr


def test_every_algorithm_file_is_registered_and_validates():
    from fedapps.config import available
    from fedapps.registry import ALGORITHMS

    assert sorted(ALGORITHMS) == available("algorithm")
    for name in ALGORITHMS:
        validate(load_config("quickstart", [f"algorithm={name}"]))
