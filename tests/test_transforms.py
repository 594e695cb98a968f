"""Per-client data transforms: table validation, composition order, seeding, caching."""

import numpy as np
import pytest
import torch

from fedapps.config import ConfigError, load_config
from fedapps.data import (
    TRANSFORMS,
    ClientData,
    Param,
    Transform,
    apply_transforms,
    federated_data,
    make_federated,
)
from fedapps.data import rebalance as rb
from fedapps.data.transforms import transform_chain
from fedapps.registry import ALGORITHMS
from fedapps.validation import resolve_config, validate


def config(*overrides, experiment="fedreb-quick"):
    cfg = resolve_config(experiment, list(overrides), check_data=False)  # algo defaults too
    return cfg, federated_data(cfg)


def fresh(fd):
    """The same partition without this process's memo (as a new process sees it)."""
    return make_federated(fd.pool, fd.key)


def test_no_transform_is_the_plain_client_data():
    cfg, fd = config(experiment="quickstart")
    assert apply_transforms(cfg, fd, 2, "cpu") is fd.client(2, "cpu")
    assert ALGORITHMS["fedavg"].client_data(cfg, fd, 2, "cpu") is fd.client(2, "cpu")


def test_algorithm_transforms_are_prepended_unless_listed():
    cfg, _ = config("data.transforms=[label-noise]")
    assert [n for n, _ in transform_chain(cfg, ("rebalance",))] == ["rebalance", "label-noise"]
    cfg, _ = config("data.transforms=[label-noise,rebalance]")
    assert [n for n, _ in transform_chain(cfg, ("rebalance",))] == ["label-noise", "rebalance"]
    params = dict(transform_chain(cfg, ("rebalance",)))
    assert params == {"label-noise": {"p": 0.1, "ratio": None, "matrix": None,
                                      "row_max_below": None},
                      "rebalance": {"scope": "client", "threshold": "mean",
                                    "augmentation": "simple"}}


def test_label_noise_changes_only_train_labels_to_other_classes():
    cfg, fd = config("data.transforms=[label-noise]", "data.label-noise.p=0.3",
                     experiment="quickstart")
    clean = fd.client(0)
    noisy = apply_transforms(cfg, fd, 0)
    mask = noisy.label_noise_mask.numpy()
    changed = (noisy.y_train != clean.y_train).numpy()
    assert np.array_equal(mask, changed)  # a replaced label is always another class
    assert 0.2 < changed.mean() < 0.4
    assert noisy.y_test is clean.y_test and noisy.x_train is clean.x_train  # untouched
    assert noisy.y_train.dtype == torch.int64


def test_label_noise_is_seeded_per_seed_and_client():
    cfg, fd = config("data.transforms=[label-noise]", "data.label-noise.p=0.5",
                     experiment="quickstart")
    a = apply_transforms(cfg, fd, 0).label_noise_mask
    b = apply_transforms(cfg, fresh(fd), 0).label_noise_mask
    assert torch.equal(a, b)  # deterministic across processes
    other_seed = cfg.copy()
    other_seed.seed = 1
    assert not torch.equal(apply_transforms(other_seed, fresh(fd), 0).label_noise_mask, a)
    masks = [apply_transforms(cfg, fd, pid).label_noise_mask for pid in range(3)]
    n = min(len(m) for m in masks)
    assert not torch.equal(masks[0][:n], masks[1][:n])
    assert not torch.equal(masks[1][:n], masks[2][:n])


def test_composition_order_matters():
    # rebalance first (the fedreb default): D_r is built from the clean labels
    cfg, fd = config("data.transforms=[label-noise]", "data.label-noise.p=0.5")
    first = ALGORITHMS["fedreb"].client_data(cfg, fd, 0, "cpu")
    plain = ALGORITHMS["fedreb"].client_data(config()[0], fd, 0, "cpu")
    assert torch.equal(first.x_reb, plain.x_reb) and torch.equal(first.y_reb, plain.y_reb)
    assert not torch.equal(first.y_train, plain.y_train)
    # label noise first: D_r is built from the noisy labels
    cfg2, _ = config("data.transforms=[label-noise,rebalance]", "data.label-noise.p=0.5")
    second = ALGORITHMS["fedreb"].client_data(cfg2, fd, 0, "cpu")
    # a step is seeded by its position too: label-noise at 0 draws other flips than at 1
    assert not torch.equal(second.label_noise_mask, first.label_noise_mask)
    noisy_counts = np.bincount(second.y_train.numpy(), minlength=10)
    reb_classes = set(second.y_reb.tolist())
    assert reb_classes == {c for c in range(10) if noisy_counts[c] > 0}
    assert second.n_eff == rb.effective_samples(noisy_counts, second.target)


def test_transforms_are_memoized_and_rebalance_is_cached_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDAPPS_CACHE", str(tmp_path))
    cfg, fd = config()
    fd = fresh(fd)
    a = ALGORITHMS["fedreb"].client_data(cfg, fd, 1, "cpu")
    assert ALGORITHMS["fedreb"].client_data(cfg, fd, 1, "cpu") is a  # in memory
    assert len(list((tmp_path / "transforms").glob("digits-rebalance-*.npz"))) == 1

    def no_augmentation(*args, **kwargs):
        raise AssertionError("augmented again instead of reading the cache")

    monkeypatch.setattr(rb, "augment", no_augmentation)
    b = ALGORITHMS["fedreb"].client_data(cfg, fresh(fd), 1, "cpu")  # a new process: disk
    assert b is not a and torch.equal(a.x_reb, b.x_reb) and torch.equal(a.y_reb, b.y_reb)
    assert (a.n_eff, a.target) == (b.n_eff, b.target)


def test_a_new_transform_is_one_function_and_one_entry(monkeypatch):
    def scale(ctx, data):
        return data.replace(x_train=data.x_train * ctx.params["factor"],
                            extras={"order": [*data.extras.get("order", []), ctx.position]})

    monkeypatch.setitem(TRANSFORMS, "scale", Transform(scale, (
        Param("factor", "train.lr", float, 1.0, low=0, low_open=True),)))
    cfg, fd = config("data.transforms=[label-noise,scale]", experiment="quickstart")
    validate(cfg, check_data=False)
    out = apply_transforms(cfg, fd, 0)
    assert out.order == [1] and torch.allclose(out.x_train, fd.client(0).x_train * 0.05)
    assert out.label_noise_mask is not None  # extras of earlier steps survive


@pytest.mark.parametrize("overrides, message", [
    (["data.transforms=[blur]"],
     "data.transforms: unknown transform 'blur'; allowed: rebalance, label-noise"),
    (["data.transforms=[label-noise,label-noise]"],
     "data.transforms=['label-noise', 'label-noise']: 'label-noise' is listed twice"),
    (["data.label-noise.p=1.5"], "data.label-noise.p=1.5: must be in [0, 1]"),
    (["data.transforms=label-noise"], "data.transforms='label-noise': must be a list"),
    (["data.transforms=[rebalance]"], "algo.scope: not set"),
    (["algorithm=fedreb", "algo.threshold=min"],
     "algo.threshold='min': allowed: mean, median, max, secmin"),
])
def test_bad_transform_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(load_config("quickstart", overrides), check_data=False)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_client_data_extras_read_as_attributes_and_move_together():
    x, y = torch.zeros(4, 1, 2, 2), torch.arange(4)
    d = ClientData(x, y, x, y).replace(extras={"n_eff": 3, "x_reb": x})
    assert d.n_eff == 3 and d.x_reb is x
    assert d.to("cpu").n_eff == 3
    with pytest.raises(AttributeError):
        _ = d.missing
