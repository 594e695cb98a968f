import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from fedapps.config import clients_per_round, load_config
from fedapps.errors import ConfigError
from fedapps.validation import validate


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


# ---- typed algorithm settings (fedapps/settings.py, one dataclass per algorithm) -------------
@pytest.mark.parametrize("overrides, message", [
    (["algorithm=fedprox", "algo.mu=-1"], "algo.mu=-1: must be a number >= 0"),
    (["algorithm=fedprox", "algo.mu=abc"], "algo.mu='abc': must be a number >= 0"),
    (["algorithm=feddyn", "algo.alpha=0"], "algo.alpha=0: must be a number > 0"),
    (["algorithm=ditto", "algo.personal-epochs=1.5"],
     "algo.personal-epochs=1.5: must be an integer >= 1"),
    (["algorithm=ditto", "algo.lambda=true"], "algo.lambda=True: must be a number >= 0"),
    (["algorithm=fedrep", "algo.head-epochs=0"], "algo.head-epochs=0: must be an integer >= 1"),
    (["algorithm=fedper", "algo.shared-prefix=head."],
     "algo.shared-prefix='head.': allowed: , base."),
    (["algorithm=fedreb", "algo.stage-order=random"],
     "algo.stage-order='random': allowed: interleaved, sequential"),
    (["algorithm=fedreg", "algo.augmentation=none"],
     "algo.augmentation='none': allowed: simple, auto"),
    (["algorithm=fedrolex", "algo.hidden=[0,8]"],
     "algo.hidden=[0, 8]: channel counts must be integers >= 1"),
    (["algorithm=fedrolex", "algo.hidden=[8.5]"],
     "algo.hidden=[8.5]: channel counts must be integers >= 1"),
    (["algorithm=heterofl", "algo.levels=[]"], "algo.levels=[]: must be a non-empty list"),
    (["algorithm=heterofl", "algo.levels=[0,1]"],
     "algo.levels=[0, 1]: capacities must be in (0, 1]"),
    (["algorithm=feddropout", "algo.levels=0.5"], "algo.levels=0.5: must be a list of numbers"),
    (["algorithm=fedrolex", "algo.rho=-0.1"], "algo.rho=-0.1: must be a number >= 0"),
    (["algorithm=fedrolex", "algo.server-scale=0.5"],
     "algo.server-scale=0.5: must be a number >= 1"),
    (["algorithm=fedrolex", "algo.label-mask=2"], "algo.label-mask=2: must be true or false"),
    (["algorithm=fedrolex", "algo.model=resnet"],
     "algo.model='resnet': allowed: width-cnn, preresnet18"),
    (["algorithm=heterofl", "algo.assignment=static"],
     "algo.assignment='static': allowed: dynamic, fixed"),
])
def test_algo_rules_name_the_key_value_and_rule(overrides, message):
    with pytest.raises(ConfigError) as err:
        check(*overrides)
    assert str(err.value) == message


@pytest.mark.parametrize("overrides, message", [
    (["algorithm=fedprox", "algo.lambda=1"], "algo.lambda: unknown key; allowed here: mu, mu-mode"),
    (["algorithm=ditto", "algo.mu=1"],
     "algo.mu: unknown key; allowed here: lambda, personal-epochs"),
    (["algorithm=fedbabu", "algo.head-epochs=1"],
     "algo.head-epochs: unknown key; allowed here: finetune-epochs, shared-prefix"),
    (["algo.mu=1"], "algo.mu: unknown key; allowed here: none (this algorithm takes no algo keys)"),
])
def test_unknown_algo_key_lists_the_settings_fields(overrides, message):
    with pytest.raises(ConfigError) as err:
        check(*overrides)
    assert str(err.value) == message


def test_experiment_algo_keys_do_not_fit_another_algorithm():
    with pytest.raises(ConfigError,
                       match=r"^algo.label-mask: unknown key; allowed here: mu, mu-mode$"):
        validate(load_config("fedrolex-fmnist", ["algorithm=fedprox"]), check_data=False)


def test_algo_defaults_come_from_the_dataclass():
    from clients.ditto import DittoSettings
    from fedapps.config import CONF_DIR
    from fedapps.registry import ALGORITHMS
    from fedapps.settings import as_dict, check_defaults

    assert check("algorithm=ditto").algo == {"lambda": 0.1, "personal-epochs": 5}
    assert as_dict(DittoSettings()) == {"lambda": 0.1, "personal-epochs": 5}
    for name, spec in ALGORITHMS.items():
        preset = OmegaConf.load(CONF_DIR / "algorithm" / f"{name}.yaml")
        check_defaults(spec.settings)  # the defaults obey their own rules
        cfg = check(f"algorithm={name}")
        if name == "fedreg":  # the one preset: FedReb with the global-scope threshold
            assert dict(preset.algo) == {"scope": "global"}
            assert cfg.algo == {**as_dict(spec.settings()), "scope": "global"}
        else:  # the YAML declares no algo keys; the resolved config has the dataclass defaults
            assert "algo" not in preset
            assert cfg.algo == as_dict(spec.settings())


def test_defaults_values_and_types_of_partial_training():
    from clients.partial import PartialSettings
    from fedapps.registry import algo_settings

    cfg = check("algorithm=fedrolex", "algo.levels=[1,0.5]", "algo.server-scale=2")
    assert cfg.algo.hidden == [32, 64, 128] and cfg.algo.capacity == "uniform"
    assert cfg.algo["label-mask"] is False and cfg.algo.rho == 0.5
    typed = algo_settings(cfg)
    assert typed == PartialSettings(levels=(1.0, 0.5), server_scale=2.0)
    assert isinstance(typed.server_scale, float) and typed.hidden == (32, 64, 128)


def test_typed_settings_reach_the_client_and_the_strategy(tmp_path):
    from flwr.common import Context, RecordDict

    from clients.feddyn import FedDynSettings
    from clients.fedprox import FedProxClient, FedProxSettings
    from fedapps.client_app import client_fn
    from fedapps.server_app import server_fn
    from strategies.feddyn import FedDyn

    def context(overrides: str) -> Context:
        return Context(run_id=1, node_id=1, state=RecordDict(),
                       node_config={"partition-id": 0, "num-partitions": 10},
                       run_config={"experiment": "quickstart", "overrides": overrides,
                                   "output-dir": str(tmp_path), "run-name": "r"})

    client = client_fn(context("algorithm=fedprox algo.mu=0.25")).numpy_client
    assert isinstance(client, FedProxClient) and client.algo == FedProxSettings(mu=0.25)
    strategy = server_fn(context("algorithm=feddyn algo.alpha=0.05")).strategy
    assert isinstance(strategy, FedDyn) and strategy.algo == FedDynSettings(alpha=0.05)
    # the results' config.yaml names every algo key, defaults included
    assert OmegaConf.load(tmp_path / "r" / "config.yaml").algo == {"alpha": 0.05}
    client = client_fn(context("algorithm=ditto")).numpy_client
    assert (client.algo.lambda_, client.algo.personal_epochs) == (0.1, 5)


def test_fedapps_validate_prints_the_algo_defaults():
    proc = subprocess.run([sys.executable, "-m", "fedapps.cli", "validate", "quickstart",
                           "--set", "algorithm=fedrep"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    algo = OmegaConf.create(proc.stdout).algo
    assert algo == {"shared-prefix": "", "head-epochs": 5, "base-epochs": 1}


def test_settings_builder_directly():
    from dataclasses import dataclass

    from fedapps.settings import AlgoSettings, allowed_keys, build_settings, setting

    @dataclass(frozen=True)
    class Demo(AlgoSettings):
        some_rate: float = setting(0.5, gt=0, le=1)
        lambda_: float = setting(1.0)
        flag: bool = setting(True)

    assert allowed_keys(Demo) == ["flag", "lambda", "some-rate"]
    assert build_settings(Demo, {"some-rate": 1, "lambda": -3}) == Demo(1.0, -3.0, True)
    with pytest.raises(ConfigError, match=r"^algo.some-rate=0: must be in \(0, 1\]$"):
        build_settings(Demo, {"some-rate": 0})
    with pytest.raises(ConfigError, match=r"^algo=3: must be a mapping"):
        build_settings(Demo, 3)  # type: ignore[arg-type]
