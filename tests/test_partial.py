"""FedRolex / HeteroFL / Federated Dropout: capacities, sub-models, strategy round trip."""

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients.arrays import get_arrays
from clients.partial import PartialSettings
from fedapps.models import WidthCNN
from fedapps.settings import build_settings
from strategies.partial import INCOME, FedDropout, FedRolex, HeteroFL, capacities

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]


def test_capacity_distributions():
    rng = np.random.default_rng(0)
    u = capacities("uniform", LEVELS, 5000, 0.5, rng)
    assert set(u.tolist()) == set(LEVELS)
    assert all(abs(np.mean(u == b) - 0.2) < 0.03 for b in LEVELS)
    r = capacities("rho", LEVELS, 5000, 0.3, rng)
    assert set(r.tolist()) == {1.0, 0.0625} and abs(np.mean(r == 1.0) - 0.3) < 0.03
    inc = capacities("income", LEVELS, 20000, 0.5, rng)
    for beta, share in INCOME.items():
        assert abs(np.mean(inc == beta) - share) < 0.015
    assert sum(INCOME.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("beta", LEVELS)
def test_sub_model_at_each_beta_trains_with_the_right_shapes(beta):
    full = WidthCNN(1, 10, (32, 64, 128))
    sub = WidthCNN(1, 10, (32, 64, 128), beta)
    s = make(FedRolex, full, algo={"levels": [beta]})
    arrays = sent(s, 1, [0])[0]
    assert [a.shape for a in arrays] == [tuple(v.shape) for v in sub.state_dict().values()]
    out = sub(torch.randn(4, 1, 28, 28))
    out.sum().backward()
    assert out.shape == (4, 10)


def test_parameter_counts_scale_with_beta():
    counts = [sum(p.numel() for p in WidthCNN(1, 10, (32, 64, 128), b).parameters())
              for b in LEVELS]
    assert counts == sorted(counts, reverse=True)
    # the middle conv dominates and scales with beta^2: halving the width roughly quarters it
    assert 3.3 < counts[0] / counts[1] < 4.0


def make(cls, model, algo=None, n=4):
    return cls(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
               num_rounds=3, num_clients=n, clients_per_round=n, seed=0,
               algo=build_settings(PartialSettings,
                                   {"capacity": "uniform", "levels": LEVELS, **(algo or {})}),
               specs=model.param_groups(), widths=model.group_widths())


def sent(s, rnd, pids):
    """The sub-models the round's plan sends to `pids` (opening the step, as configure_fit)."""
    plan = s.open_step(rnd, 0, pids)
    return [plan.get(p).arrays for p in pids]


def upload(pid, arrays):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 10, {"partition-id": pid})


def test_full_capacity_round_trip_is_the_identity():
    model = WidthCNN(1, 10, (8, 16))
    s = make(FedRolex, model, algo={"levels": [1.0]}, n=1)
    down = sent(s, 1, [0])[0]
    assert all(np.array_equal(a, b) for a, b in zip(down, s.global_arrays, strict=True))
    trained = [a + 0.5 for a in down]
    params, _ = s.aggregate_fit(1, [(None, upload(0, trained))], [])
    out = parameters_to_ndarrays(params)
    assert all(np.allclose(a, b) for a, b in zip(out, trained, strict=True))


def test_selective_averaging_in_a_round_with_two_capacities():
    model = WidthCNN(1, 10, (8,))
    s = make(HeteroFL, model, algo={"capacity": "rho", "rho": 0.5, "levels": [1.0, 0.25]}, n=2)
    s.beta = lambda rnd, pid: [1.0, 0.25][pid]  # client 0 full, client 1 a quarter
    big, small = sent(s, 1, [0, 1])
    params, _ = s.aggregate_fit(1, [(None, upload(0, [np.full_like(a, 1.0) for a in big])),
                                    (None, upload(1, [np.full_like(a, 3.0) for a in small]))],
                                [])
    conv = parameters_to_ndarrays(params)[0]  # [8, 1, 3, 3]; HeteroFL: client 1 has rows 0, 1
    assert np.all(conv[:2] == 2.0) and np.all(conv[2:] == 1.0)


def _aggregate_round(s, rnd, betas, values):
    """One round of `s` with the given capacity and constant upload value per client."""
    s.beta = lambda r, pid: betas[pid]
    pids = sorted(betas)
    subs = sent(s, rnd, pids)
    res = [(None, upload(pid, [np.full_like(a, values[pid]) for a in arrs]))
           for pid, arrs in zip(pids, subs, strict=True)]
    params, _ = s.aggregate_fit(rnd, res, [])
    return parameters_to_ndarrays(params)


@pytest.mark.parametrize("weighting,conv_shared", [
    ("none", 2.0),                       # (1 + 3) / 2
    ("model-size", (8 * 1.0 + 2 * 3.0) / 10),  # local widths 8 and 2 (FedRolex code: width)
])
def test_table_3_4_size_weighting_is_the_layers_local_width_on_conv_kernels_only(
        weighting, conv_shared):
    """Table 3.4 as the FedRolex code: the weight is the conv layer's local width (its output
    channels in the client's sub-model) and only conv kernels are weighted; the conv bias,
    the norm and the classifier keep equal weights."""
    model = WidthCNN(1, 10, (8,))
    s = make(HeteroFL, model, algo={"levels": [1.0, 0.25], "weighting": weighting}, n=2)
    out = _aggregate_round(s, 1, {0: 1.0, 1: 0.25}, {0: 1.0, 1: 3.0})
    conv, conv_bias, norm_w, _, cls_w, cls_b = out  # client 1 holds channels 0, 1
    assert np.allclose(conv[:2], conv_shared) and np.all(conv[2:] == 1.0)
    for shared in (conv_bias[:2], norm_w[:2], cls_w[:, :2], cls_b):
        assert np.allclose(shared, 2.0)
    assert np.all(conv_bias[2:] == 1.0) and np.all(cls_w[:, 2:] == 1.0)


def test_table_3_4_update_weighting_counts_each_entrys_updates_as_the_reference():
    """model-update / hybrid: each conv entry weighs its update count (1 + earlier holders),
    counted as the FedRolex code's loop does: later clients of a round read the increments of
    the earlier ones, except in the first state entry (read at the round's start)."""
    model = WidthCNN(1, 10, (8, 8))  # conv kernels: arrays 0 (first entry) and 4, [8, 8, 3, 3]
    s = make(HeteroFL, model, algo={"levels": [1.0, 0.5, 0.25], "weighting": "model-update"},
             n=3)
    betas, values = {0: 1.0, 1: 0.25, 2: 0.5}, {0: 1.0, 1: 3.0, 2: 5.0}
    out = _aggregate_round(s, 1, betas, values)
    first, second, bias = out[0], out[4], out[1]
    # first entry: counts at the round's start (all 1) -> plain means
    assert np.allclose(first[:2], 3.0) and np.allclose(first[2:4], 3.0) and np.all(first[4:] == 1)
    # second conv: running counts 1, 2, 3 where all three hold it; 1, 2 where clients 0 and 2
    assert np.allclose(second[:2, :2], (1 * 1 + 2 * 3 + 3 * 5) / 6)
    assert np.allclose(second[2:4, 2:4], (1 * 1 + 2 * 5) / 3)
    assert np.allclose(second[:2, 2:4], (1 * 1 + 2 * 5) / 3)
    assert np.all(second[4:] == 1.0) and np.all(second[:, 4:] == 1.0)
    assert np.allclose(bias[:2], 3.0)  # not a conv kernel: equal weights
    counts = s.state_arrays()["update-counts"]  # server state, in the checkpoint
    assert counts[1][0, 0, 0, 0] == 4 and counts[1][3, 3, 0, 0] == 3 and counts[1][7, 7, 0, 0] == 2
    restored = make(HeteroFL, model, algo={"levels": [1.0, 0.5, 0.25],
                                           "weighting": "model-update"}, n=3)
    restored.load_state_arrays(s.state_arrays())
    assert all(np.array_equal(a, b) for a, b in zip(restored.update_counts.values(),
                                                     s.update_counts.values(), strict=True))
    # round 2: entry [0, 0] starts at count 4; client 1 reads 4, client 2 reads 5
    out = _aggregate_round(s, 2, {1: 1.0, 2: 0.25}, {1: 2.0, 2: 6.0})
    assert np.allclose(out[4][:2, :2], (4 * 2.0 + 5 * 6.0) / 9)
    assert np.allclose(out[0][:2], 4.0)  # first entry: both read the round-start count 4
    hybrid = make(HeteroFL, model, algo={"levels": [1.0, 0.5, 0.25], "weighting": "hybrid"},
                  n=3)
    out = _aggregate_round(hybrid, 1, betas, values)
    # widths 8, 2, 4 times running counts 1, 2, 3
    assert np.allclose(out[4][:2, :2], (8 * 1 * 1.0 + 2 * 2 * 3.0 + 4 * 3 * 5.0) / (8 + 4 + 12))
    assert np.allclose(out[0][:2], (8 * 1.0 + 2 * 3.0 + 4 * 5.0) / 14)  # first: widths only


def test_feddropout_per_layer_draws_every_conv_independently_as_the_reference():
    """algo.random-draw=per-layer: one random subset per conv (the reference's randperm per
    layer); norms and the next layer's inputs follow the conv before them, a projection
    shortcut maps the block's input set to its output set, the classifier reads the last."""
    from clients.arrays import set_arrays
    from fedapps.models import PreResNet18

    hidden = (8, 16, 32, 64)
    full, sub = PreResNet18(3, 10, hidden), PreResNet18(3, 10, hidden, beta=0.5)
    specs, widths = full.layer_groups()
    assert len(widths) == 17 and widths["layers.2.conv1"] == 16  # stem + 16 block convs
    s = FedDropout(initial_arrays=get_arrays(full), array_names=list(full.state_dict()),
                   num_rounds=3, num_clients=1, clients_per_round=1, seed=0,
                   algo=build_settings(PartialSettings, {"levels": [0.5],
                                                         "random-draw": "per-layer"}),
                   specs=specs, widths=widths)
    plan = s.open_step(1, 0, [0])
    idx, arrays = plan.get(0).facts["index"], plan.get(0).arrays
    assert all(len(idx[g]) == widths[g] // 2 for g in widths)
    assert idx["layers.0.conv1"].tolist() != idx["layers.0.conv2"].tolist()  # independent
    g = dict(zip(full.state_dict(), s.global_arrays, strict=True))
    a = dict(zip(full.state_dict(), arrays, strict=True))
    ix = np.ix_
    assert np.array_equal(a["layers.1.bn1.weight"], g["layers.1.bn1.weight"][idx["layers.0.conv2"]])
    assert np.array_equal(a["layers.1.conv1.weight"], g["layers.1.conv1.weight"][
        ix(idx["layers.1.conv1"], idx["layers.0.conv2"])])
    assert np.array_equal(a["layers.2.shortcut.weight"], g["layers.2.shortcut.weight"][
        ix(idx["layers.2.conv2"], idx["layers.1.conv2"])])
    assert np.array_equal(a["classifier.weight"],
                          g["classifier.weight"][:, idx["layers.7.conv2"]])
    set_arrays(sub, arrays)  # the client's width-1/2 model takes them
    sub(torch.randn(2, 3, 32, 32)).sum().backward()
    # the default shares one draw per width: both convs of block 0 (width 8) get one set
    per_width = make(FedDropout, full, algo={"levels": [0.5]}, n=1)
    assert set(per_width.open_step(1, 0, [0]).get(0).facts["index"]) == {"w8", "w16", "w32",
                                                                         "w64"}


def test_the_three_schemes_differ_only_in_the_index_sets():
    model = WidthCNN(1, 10, (16, 32))
    idx = {}
    for cls in (FedRolex, HeteroFL, FedDropout):
        s = make(cls, model, algo={"levels": [0.25]})
        idx[cls.__name__] = s.plan(3, 0, [0]).get(0).facts["index"]["w16"].tolist()
    assert idx["HeteroFL"] == [0, 1, 2, 3]
    assert idx["FedRolex"] == [2, 3, 4, 5]  # round 3 -> 0-based j = 2
    assert len(set(idx["FedDropout"])) == 4 and idx["FedDropout"] == sorted(idx["FedDropout"])


def test_preresnet18_matches_seed_004_table_3_6_parameter_counts():
    from fedapps.models import PreResNet18

    counts = [sum(p.numel() for p in PreResNet18(3, 10, beta=b).parameters()) for b in LEVELS]
    assert counts[0] == 11_172_170  # Table 3.6: 11.1722 million (largest)
    assert counts[-1] == 44_510  # Table 3.6: 0.04451 million (smallest)
    assert np.mean(counts) == pytest.approx(2.9781232e6, rel=1e-5)  # FedRolex, uniform levels


@pytest.mark.parametrize("beta", LEVELS)
def test_preresnet18_sub_models_line_up_with_extraction(beta):
    from fedapps.models import PreResNet18

    full, sub = PreResNet18(3, 10), PreResNet18(3, 10, beta=beta)
    s = make(FedRolex, full, algo={"levels": [beta]})
    arrays = sent(s, 7, [0])[0]
    assert [a.shape for a in arrays] == [tuple(v.shape) for v in sub.state_dict().values()]
    from clients.arrays import set_arrays

    set_arrays(sub, arrays)  # loads: residual additions line up across equal widths
    sub(torch.randn(2, 3, 32, 32)).sum().backward()


def test_forward_flops_hand_computed():
    from torch import nn

    from clients.flops import forward_flops

    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 5 * 5, 3))
    # conv: 2 * (4 * 5 * 5 outputs) * (3 * 3 * 1); linear: 2 * 3 * 100
    assert forward_flops(model, (1, 5, 5)) == 2 * 100 * 9 + 2 * 3 * 100


def test_preresnet18_flops_agree_with_table_3_6():
    from clients.flops import forward_flops
    from fedapps.models import PreResNet18

    macs = forward_flops(PreResNet18(3, 10), (3, 32, 32)) / 2
    assert macs == pytest.approx(557.656e6, rel=0.01)  # the paper also counts norm layers


def _two_class_client(label_mask):
    from clients.base import TrainSettings
    from clients.partial import PartialClient
    from fedapps.data import ClientData

    x = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([3, 7, 3, 7, 3, 7, 3, 7])  # a client holding classes 3 and 7 only
    torch.manual_seed(0)
    model = WidthCNN(1, 10, (4, 8, 16))
    return PartialClient(model, ClientData(x[:4], y[:4], x[4:], y[4:]),
                         TrainSettings(1, 4, 0.01, 0.9, 0.0, 0), 0,
                         algo=PartialSettings(label_mask=label_mask),
                         model_factory=lambda beta: WidthCNN(1, 10, (4, 8, 16), beta))


def test_label_masked_local_accuracy_argmaxes_over_the_clients_classes():
    client = _two_class_client(label_mask=True)
    with torch.no_grad():  # make an absent class win everywhere: unmasked G is 0, masked P not
        client.model.classifier.bias.copy_(torch.tensor([50.0] + [0.0] * 9))
        client.model.classifier.bias[3] = 1.0
    arrays = get_arrays(client.model)
    _, n, metrics = client.evaluate(arrays, {})
    assert n == 4 and metrics["correct-global"] == 0
    with torch.no_grad():
        logits = client.model(client.data.x_test)
    # the reference's mask: the absent classes' logits become 0, the held ones stay
    best_held = torch.maximum(logits[:, 3], logits[:, 7])
    expected = torch.where(best_held < 0, 0, torch.where(logits[:, 3] >= logits[:, 7], 3, 7))
    assert metrics["correct-personal"] == int((expected == client.data.y_test).sum()) > 0
    with torch.no_grad():  # both held classes far below 0: an absent class's 0 wins
        client.model.classifier.bias[3] = client.model.classifier.bias[7] = -100.0
    _, _, metrics = client.evaluate(get_arrays(client.model), {})
    assert metrics["correct-personal"] == 0  # (-inf masking would still pick 3 or 7)
    plain = _two_class_client(label_mask=False)
    _, _, unmasked = plain.evaluate(arrays, {})
    assert unmasked["correct-personal"] == unmasked["correct-global"] == 0


def test_masked_training_loss_gives_absent_classes_a_zero_logit():
    """The reference's masked CE: `output.masked_fill(label_mask == 0, 0)`, so absent classes
    still add e^0 to the softmax (not -1e9); the loss the client trains on is that one."""
    import torch.nn.functional as F

    client = _two_class_client(label_mask=True)
    x, y = client.data.x_train, client.data.y_train
    with torch.no_grad():
        logits = client.model(x)
    absent = torch.ones(10, dtype=torch.bool)
    absent[[3, 7]] = False
    zeroed = logits.clone()
    zeroed[:, absent] = 0.0
    expected = F.cross_entropy(zeroed, y).item()
    seen = []
    original = client.sgd_epochs

    def spy(params, loss_fn, epochs, *args, **kwargs):
        client.model.eval()
        with torch.no_grad():
            seen.append(loss_fn(x, y).item())
        client.model.train()
        return original(params, loss_fn, epochs, *args, **kwargs)

    client.sgd_epochs = spy
    client.local_train({})
    assert seen[0] == pytest.approx(expected, rel=1e-6)
    assert seen[0] != pytest.approx(F.cross_entropy(logits.masked_fill(absent, -1e9), y).item())


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_local_steps_clip_the_gradient_norm_as_the_reference(clip):
    """algo.clip-grad-norm (default 1, the FedRolex/HeteroFL code's clip_grad_norm_(.., 1)):
    one full-batch step equals a hand-written SGD step on the clipped gradient; 0 = none."""
    import copy

    import torch.nn.functional as F

    client = _two_class_client(label_mask=False)
    client.algo = PartialSettings(clip_grad_norm=clip)
    ref = copy.deepcopy(client.model)
    x, y = client.data.x_train, client.data.y_train
    loss = F.cross_entropy(ref(x), y)
    grads = torch.autograd.grad(loss, list(ref.parameters()))
    norm = torch.sqrt(sum(g.square().sum() for g in grads))
    assert norm > 1.0  # the case where clipping matters
    scale = min(1.0, clip / (float(norm) + 1e-6)) if clip else 1.0
    expected = [p.detach() - 0.01 * scale * g for p, g in zip(ref.parameters(), grads,
                                                              strict=True)]
    client.local_train({})
    for p, e in zip(client.model.parameters(), expected, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=1e-4, atol=1e-6)
