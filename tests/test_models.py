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


# Seed 002 Appendix A, counted by hand (weights + biases; BatchNorm: weight + bias):
# MNIST_CNN: conv 1*10*25+10, conv 10*20*25+20, FC 320*50+50, FC 50*10+10
# FashionMNISTCNN: conv 1*16*25+16, BN 2*16, conv 16*32*25+32, BN 2*32, FC 7*7*32*10+10
# Cifar10CNN: convs 3-32-32-64-64-128-128 (3x3), six BNs, FC 2048*128+128, FC 128*10+10
THESIS = {
    "thesis-mnist-cnn": ((1, 28, 28), 260 + 5_020 + 16_050 + 510, 510),
    "thesis-fmnist-cnn": ((1, 28, 28), 416 + 32 + 12_832 + 64 + 15_690, 15_690),
    "thesis-cifar10-cnn": ((3, 32, 32),
                           896 + 9_248 + 18_496 + 36_928 + 73_856 + 147_584
                           + 2 * (32 + 32 + 64 + 64 + 128 + 128) + 262_272 + 1_290, 1_290),
}


@pytest.mark.parametrize("name", sorted(THESIS))
def test_thesis_cnns_match_appendix_a(name):
    shape, total, last_fc = THESIS[name]
    model = build_model(name, shape, 10, head_depth=1)
    assert n_params(model) == total
    assert n_params(model.head) == last_fc  # head depth 1 = the last FC layer
    model.eval()
    out = model(torch.randn(4, *shape))
    assert out.shape == (4, 10)
    # building probes the feature size in eval mode: BatchNorm statistics are untouched
    for key, value in model.state_dict().items():
        if key.endswith("running_mean"):
            assert torch.equal(value, torch.zeros_like(value)), key
    if name == "thesis-cifar10-cnn":  # FLTK's softmax output, kept (section 7)
        assert torch.allclose(out.sum(dim=1), torch.ones(4))


def test_thesis_mnist_cnn_head_depth_two_holds_both_fc_layers_and_dropout():
    model = build_model("thesis-mnist-cnn", (1, 28, 28), 10, head_depth=2)
    assert n_params(model.head) == 16_050 + 510
    assert any(isinstance(m, torch.nn.Dropout) for m in model.head.modules())
    with pytest.raises(ValueError):
        build_model("thesis-fmnist-cnn", (1, 28, 28), 10, head_depth=2)  # one FC layer only


def test_batchnorm_statistics_of_the_thesis_fmnist_cnn_are_averaged_by_fedavg():
    """In process on digits (8x8 fits its two pools), one fit step of the strategy: the running
    statistics and the int64 batch counter travel, pass the upload check and come back as the
    clients' weighted average."""
    import numpy as np
    from flwr.common import FitRes, ndarrays_to_parameters, parameters_to_ndarrays

    from clients.fedavg import FedAvgClient
    from fedapps.runtime import make_model, train_settings
    from strategies.aggregation import weighted_average
    from strategies.fedavg import FedAvg
    from tests.inprocess import OK, LocalManager, digits_setup

    cfg, fd = digits_setup(2)
    cfg.model.name, cfg.model["head-depth"] = "thesis-fmnist-cnn", 1
    model = make_model(cfg)
    strategy = FedAvg(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                      num_rounds=1, num_clients=2, clients_per_round=2, seed=0)
    manager = LocalManager({pid: FedAvgClient(make_model(cfg), fd.client(pid),
                                              train_settings(cfg), pid) for pid in range(2)})
    params = strategy.initialize_parameters(manager)
    answers, results = [], []
    for proxy, ins in strategy.configure_fit(1, params, manager):
        arrays, n, metrics = proxy.client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
        answers.append((arrays, n))
        results.append((proxy, FitRes(OK, ndarrays_to_parameters(arrays), n, metrics)))
    strategy.aggregate_fit(1, results, [])
    names = list(model.state_dict())
    expected = weighted_average([a for a, _ in answers], [n for _, n in answers])
    for name, got, want in zip(names, strategy.global_arrays, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
    mean = strategy.global_arrays[names.index("base.0.1.running_mean")]
    assert np.abs(mean).sum() > 0  # BatchNorm statistics moved and were averaged
    counter = strategy.global_arrays[names.index("base.0.1.num_batches_tracked")]
    assert counter.dtype == np.int64 and int(counter) > 0
