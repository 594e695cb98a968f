import pytest
import torch

from clients.arrays import get_arrays, set_arrays
from fedapps.models import build_model


def n_params(module):
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("shape, total", [((1, 28, 28), 573_578), ((3, 32, 32), 797_962)])
def test_convnet_matches_feddyn_parameter_count(shape, total):
    # seed 000 section 8: 797,962 parameters on CIFAR-10, 573,578 on FMNIST
    model = build_model("convnet", shape, 10, head_depth=2)
    assert n_params(model) == total
    assert model(torch.zeros(4, *shape)).shape == (4, 10)


@pytest.mark.parametrize("depth, head_params", [
    (1, 192 * 10 + 10),
    (2, 384 * 192 + 192 + 192 * 10 + 10),
    (3, 1024 * 384 + 384 + 384 * 192 + 192 + 192 * 10 + 10),
])
def test_head_depth_moves_fc_layers_into_the_head(depth, head_params):
    model = build_model("convnet", (1, 28, 28), 10, head_depth=depth)
    assert n_params(model.head) == head_params
    assert n_params(model.base) + n_params(model.head) == 573_578
    assert all(k.startswith(("base.", "head.")) for k in model.state_dict())


def test_mlp_is_the_seeds_dnn():
    model = build_model("mlp", (3, 32, 32), 10, head_depth=1)
    assert n_params(model) == 3072 * 100 + 100 + 100 * 10 + 10
    with pytest.raises(ValueError):
        build_model("mlp", (3, 32, 32), 10, head_depth=3)


def test_digits_cnn_runs_on_8x8():
    model = build_model("digits-cnn", (1, 8, 8), 10, head_depth=2)
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_arrays_roundtrip_and_prefix():
    a = build_model("convnet", (1, 28, 28), 10, 2)
    b = build_model("convnet", (1, 28, 28), 10, 2)
    set_arrays(b, get_arrays(a, "head."), prefix="head.")
    for (ka, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(va, vb) == ka.startswith("head.")
    with pytest.raises(ValueError, match="expected"):
        set_arrays(b, get_arrays(a)[:-1])
