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


def test_the_merge_equals_omegaconfs_own():
    """load_config merges plain dicts (3x faster than OmegaConf's merges); the result, raw and
    resolved, is OmegaConf's: every experiment file as it is, two with overrides of every kind
    (all 693 cells of the grid files were checked the same way once, 2026-11-28)."""
    from fedapps.config import available
    from simulations.overheads import omegaconf_merged

    cases = [(experiment, []) for experiment in available("experiment")] + [
        (experiment, overrides) for experiment in ("quickstart", "thesis-fmnist")
        for overrides in (["train.lr=0.2", "data.alpha=0.3"],
                          ["dataset=fmnist", "algorithm=fedrolex"],
                          ["model.name=null", "data.partitioner=emd", "eval.fraction=0.25"],
                          ["experiment=fedreb-quick", "rounds=7"],
                          ["algorithm=fedprox", "algo.mu=0.01"])]
    for experiment, overrides in cases:
        ours, theirs = load_config(experiment, overrides), omegaconf_merged(experiment, overrides)
        for resolve in (False, True):
            assert OmegaConf.to_container(ours, resolve=resolve) == \
                OmegaConf.to_container(theirs, resolve=resolve), (experiment, overrides)
        assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs)


def test_a_changed_config_file_is_read_again(tmp_path, monkeypatch):
    """The parsed files are cached per process, keyed by the file's mtime and size: an edited
    file (a user tuning an experiment between two runs of one process) is parsed again."""
    import os

    from fedapps import config

    conf = tmp_path / "conf"
    for kind in ("experiment", "dataset", "algorithm"):
        (conf / kind).mkdir(parents=True)
    (conf / "defaults.yaml").write_text("dataset: d\nalgorithm: a\nrounds: 1\n")
    (conf / "dataset" / "d.yaml").write_text("{}\n")
    (conf / "algorithm" / "a.yaml").write_text("{}\n")
    exp = conf / "experiment" / "e.yaml"
    exp.write_text("rounds: 2\n")
    monkeypatch.setattr(config, "CONF_DIR", conf)
    assert load_config("e").rounds == 2
    exp.write_text("rounds: 33\n")
    os.utime(exp, ns=(exp.stat().st_atime_ns, exp.stat().st_mtime_ns + 10**9))
    assert load_config("e").rounds == 33
    cfg = load_config("e")
    cfg.rounds = 5  # a caller's change stays in its own config
    assert load_config("e").rounds == 33


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
    (["model.name=resnet"], "model.name='resnet': allowed: aep-mlp, casas-bilstm, convnet, "),
    (["data.partitioner=zipf"], "data.partitioner='zipf': allowed: dirichlet, iid, shards"),
    (["data.partitioner=shards", "data.labels-per-client=11"],
     "data.labels-per-client=11: must be <= 10"),
    (["data.test-fraction=1"], "data.test-fraction=1: must be in [0, 1)"),
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
    (["algorithm=fedrolex", "algo.random-draw=per-layer"],
     "algo.random-draw='per-layer': only feddropout draws random subsets (fedrolex does not)"),
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


def test_cpus_must_be_a_positive_count_and_cannot_cap_a_cluster(capsys):
    from fedapps import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "quickstart", "--cpus", "0"])
    assert exit_info.value.code == 2
    assert "argument --cpus: '0': a whole number of CPUs, at least 1" in capsys.readouterr().err
    assert cli.main(["run", "quickstart", "--cpus", "1", "--ray-address", "10.0.0.1:6379"]) == 2
    assert capsys.readouterr().err == ("fedapps: config error: --cpus caps a Ray started on this "
                                       "machine; a cluster's CPUs (--ray-address) are its own\n")


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
    (["algorithm=feddyn", "algo.proximal-norm=l1"],
     "algo.proximal-norm='l1': allowed: squared, unsquared"),
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
     "algo.head-epochs: unknown key; allowed here: finetune-epochs, finetune-part, shared-prefix"),
    (["algo.mu=1"], "algo.mu: unknown key; this algorithm takes no algo.* keys"),
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

    client = client_fn(context("algorithm=fedprox algo.mu=0.25")).numpy_client.client()
    assert isinstance(client, FedProxClient) and client.algo == FedProxSettings(mu=0.25)
    strategy = server_fn(context("algorithm=feddyn algo.alpha=0.05")).server.strategy
    assert isinstance(strategy, FedDyn) and strategy.algo == FedDynSettings(alpha=0.05)
    # the results' config.yaml names every algo key, defaults included
    assert OmegaConf.load(tmp_path / "r" / "config.yaml").algo == {"alpha": 0.05,
                                                                    "proximal-norm": "squared"}
    client = client_fn(context("algorithm=ditto")).numpy_client.client()
    assert (client.algo.lambda_, client.algo.personal_epochs) == (0.1, 5)


@pytest.mark.parametrize("overrides", ["algorithm=fedprox",
                                       "algorithm=fedcyclic data.transforms=[label-averaging]"])
def test_the_handshake_builds_no_model_and_answers_as_the_built_client(tmp_path, overrides):
    """Thousands of simulated nodes each answer one handshake before round 1: from the data
    alone, with the numbers the algorithm's client gives (label averaging's larger bound)."""
    from flwr.common import Context, RecordDict

    from fedapps.client_app import client_fn

    node = {"partition-id": 2, "num-partitions": 10}
    run = {"experiment": "quickstart", "overrides": overrides, "output-dir": str(tmp_path),
           "run-name": "r"}
    deferred = client_fn(Context(run_id=1, node_id=1, state=RecordDict(), node_config=node,
                                 run_config=run)).numpy_client
    answer = deferred.get_properties({})
    assert deferred.built is None  # no model was built
    built = deferred.client()
    assert answer == built.get_properties({}) and answer["partition-id"] == 2
    assert answer["num-train"] >= len(built.data.y_train) > 0
    assert deferred.client() is built  # fit and evaluate of one message share one client


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


# ---- checks before anything starts (issue 19): one line on stderr, exit 2, no process --------
@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail the test if a SuperLink (simulation or deployment) were started."""
    from fedapps import launcher

    def refuse(self):
        raise AssertionError("a SuperLink was started")

    monkeypatch.setattr(launcher.LocalSuperLink, "__enter__", refuse)


def _broken_setups(tmp):
    """A file where a folder should be, a run with a truncated checkpoint, a TLS folder with
    key pairs for 2 nodes of 10."""
    import json

    import numpy as np

    (tmp / "a-file").write_text("")
    run = tmp / "truncated"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(
        {"invocation": {"experiment": "quickstart", "overrides": "rounds=2"}}))
    np.savez(run / "checkpoint.npz", round=np.array(1), global_0=np.zeros(100))
    data = (run / "checkpoint.npz").read_bytes()
    (run / "checkpoint.npz").write_bytes(data[: len(data) // 2])
    certs = tmp / "certs"
    certs.mkdir()
    for name in ("ca.pem", "server.pem", "server.key", "node-0", "node-0.pub", "node-1",
                 "node-1.pub"):
        (certs / name).write_text("x")


@pytest.mark.parametrize("argv, message", [
    (["run", "quickstart", "--set", "output.output-dir={tmp}/a-file/sub"],
     "output.output-dir='{tmp}/a-file/sub': cannot write there (Not a directory)"),
    (["resume", "{tmp}/truncated"],
     "{tmp}/truncated/checkpoint.npz: not a readable checkpoint (BadZipFile: File is not a zip "
     "file); it cannot be resumed"),
    (["deploy-local", "quickstart", "--tls", "{tmp}/certs", "--set", "output.output-dir={tmp}"],
     "--tls {tmp}/certs: missing node-2, node-2.pub, node-3 ... (node keys for 2 of 10 "
     "clients); give an empty folder to make them, or run python deploy/make_certs.py "
     "{tmp}/certs --nodes 10"),
    (["run", "quickstart", "--set", "output.run-name=../x"],
     "output.run-name='../x': must be a plain folder name (not empty, no '/' or '\\', not "
     "starting with '.')"),
    (["run", "quickstart", "--set", "output.run-name=a/b"], "output.run-name='a/b': must be a"),
    (["run", "quickstart", "--set", "algorithm=fedrolex", "--set", "model.name=mlp"],
     "model.name='mlp': fedrolex builds its own model and ignores model.*; choose it with "
     "algo.model (allowed: width-cnn, preresnet18) and algo.hidden"),
    (["reproduce", "quick", "--seeds", "0", "--output-dir", "{tmp}/grids"],
     "--seeds 0: must be >= 1 (runs seeds 0..N-1)"),
    (["reproduce", "quick", "--plots", "curve", "--output-dir", "{tmp}/grids"],
     "--plots curve: give none or some of curves, transfer, best, clients, labels"),
    (["node", "--superlink", "127.0.0.1:9", "--partition-id", "0", "--num-partitions", "0"],
     "--num-partitions=0: must be >= 1"),
    (["node", "--superlink", "127.0.0.1:9", "--partition-id", "0", "--num-partitions", "2",
      "--pull-interval", "9"], "--pull-interval 9: must be from 0.05 s to Flower's own 3 s"),
    (["deploy-local", "quickstart", "--pull-interval", "0", "--set",
      "output.output-dir={tmp}/out"],
     "--pull-interval 0: must be from 0.05 s to Flower's own 3 s"),
    (["deploy-local", "quickstart", "--link-hold", "1", "--set",
      "output.output-dir={tmp}/out"], "--link-hold 1: must be from 2 to 20 s"),
    (["deploy-local", "quickstart", "--compute-slots", "-1", "--set",
      "output.output-dir={tmp}/out"], "--compute-slots -1: must be 0 (no limit) or more"),
], ids=["unwritable-output-dir", "truncated-checkpoint", "tls-too-few-node-keys",
        "run-name-dotdot", "run-name-slash", "fedrolex-model-name", "seeds-0", "plots-curve",
        "node-num-partitions-0", "node-pull-interval-9", "deploy-pull-interval-0",
        "deploy-link-hold-1", "deploy-compute-slots-negative"])
def test_cli_refuses_before_anything_starts(argv, message, tmp_path, capsys, nothing_starts):
    """Each used to fail 20-40 s in, inside Flower, with a traceback (or ran nothing and
    exited 0: `--seeds 0`; or silently ignored a key: fedrolex's model.name)."""
    from simulations.cli import main

    tmp = tmp_path.resolve()
    _broken_setups(tmp)
    code = main([a.format(tmp=tmp) for a in argv])
    out = capsys.readouterr()
    assert code == 2
    assert out.err.startswith(f"fedapps: config error: {message.format(tmp=tmp)}")
    assert out.err.count("\n") == 1 and out.out == ""


def test_device_cuda_without_a_gpu_is_refused_before_anything_starts(tmp_path, capsys,
                                                                     monkeypatch, nothing_starts):
    import torch

    from simulations.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = main(["run", "quickstart", "--set", "device=cuda", "--set",
                 f"output.output-dir={tmp_path}"])
    assert code == 2
    assert capsys.readouterr().err == (
        "fedapps: config error: device='cuda': no CUDA GPU on this machine "
        "(torch.cuda.is_available() is False); use device=auto or cpu\n")


def test_every_command_and_argument_has_help():
    import argparse

    from simulations.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = {"run", "validate", "resume", "deploy-local", "node", "list", "reproduce",
                "partition", "centralized", "memory", "sizing"}
    assert set(sub.choices) == commands
    assert all(c in parser.description for c in commands)  # the description names them all
    listed = {c.dest: c.help for c in sub._choices_actions}
    for name, command in sub.choices.items():
        assert listed[name], f"fedapps {name}: no help"
        for action in command._actions:
            assert action.help, f"fedapps {name} {action.option_strings or action.dest}: no help"


@pytest.mark.parametrize("argv, slots", [([], "cores"), (["--compute-slots", "0"], None),
                                         (["--compute-slots", "3"], 3)])
def test_deploy_local_computes_in_as_many_slots_as_cores_by_default(argv, slots, tmp_path,
                                                                     monkeypatch, capsys):
    """fedapps/compute_slots.py: deploy-local's nodes take turns on the machine's cores unless
    told otherwise (0: all at once, which run_federation takes as None)."""
    from fedapps import deploy
    from fedapps.compute_slots import machine_cores
    from simulations.cli import main

    passed = {}

    def federation(*args, **kwargs):
        passed.update(kwargs)
        return "stopped"

    monkeypatch.setattr(deploy, "run_federation", federation)
    assert main(["deploy-local", "quickstart", "--set", f"output.output-dir={tmp_path}",
                 *argv]) == 1  # the stand-in ran nothing
    assert passed["compute_slots"] == (machine_cores() if slots == "cores" else slots)
    assert "run failed" in capsys.readouterr().err
