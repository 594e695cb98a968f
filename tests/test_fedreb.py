"""FedReb / FedReG: rebalancing arithmetic, two-stage training, split aggregation."""

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients.arrays import get_arrays
from clients.base import TrainSettings
from clients.fedreb import FedRebClient, FedRebSettings
from fedapps.config import load_config
from fedapps.data import federated_data
from fedapps.data import rebalance as rb
from fedapps.errors import ConfigError
from fedapps.models import build_model
from fedapps.registry import ALGORITHMS
from fedapps.settings import build_settings
from fedapps.validation import validate
from strategies.aggregation import split_average
from strategies.fedreb import FedReb

COUNTS = [300, 50, 10]
LABELS = np.repeat([0, 1, 2], COUNTS)


def test_worked_example_client_scope_mean():
    # seed 000 digest section 3: t = 120, |D_r| = 360, n_eff = 180, 70 and 110 augmented
    t = rb.client_target(COUNTS, "mean")
    assert t == 120
    assert rb.effective_samples(COUNTS, t) == 180
    plan = rb.plan(LABELS, t, np.random.default_rng(0))
    assert len(plan.originals) + len(plan.to_augment) == 360
    assert np.bincount(LABELS[plan.originals]).tolist() == [120, 50, 10]
    assert np.bincount(LABELS[plan.to_augment]).tolist() == [0, 70, 110]
    assert len(np.unique(plan.originals)) == 180  # drawn without replacement


def test_worked_example_global_scope():
    # FedReG: T = mean of all clients' train sizes = (360 + 200 + 100) / 3 = 220;
    # this client holds C_k = 3 classes -> Q = round(220 / 3) = round(73.33) = 73
    q = rb.global_target([360, 200, 100], COUNTS, "mean")
    assert q == 73
    assert rb.effective_samples(COUNTS, q) == 73 + 50 + 10
    plan = rb.plan(LABELS, q, np.random.default_rng(0))
    assert np.bincount(LABELS[plan.to_augment], minlength=3).tolist() == [0, 23, 63]
    # classes the client lacks do not count in C_k: [300, 0, 50, 10] gives the same Q
    assert rb.global_target([360, 200, 100], [300, 0, 50, 10], "mean") == 73


@pytest.mark.parametrize("stat, expected", [("mean", 120), ("median", 50), ("max", 300),
                                             ("secmin", 50)])
def test_threshold_statistics(stat, expected):
    assert rb.client_target(COUNTS, stat) == expected


def test_secmin_counts_duplicates_and_single_class():
    assert rb.client_target([5, 5, 40], "secmin") == 5
    assert rb.client_target([0, 7, 0], "secmin") == 7


@pytest.fixture(scope="module")
def digits():
    cfg = load_config("fedreb-quick")
    validate(cfg)  # fills in the algo defaults (FedRebSettings) that the rebalance step reads
    return cfg, federated_data(cfg)


def test_rebalanced_set_is_deterministic_and_keeps_the_class_set(digits):
    cfg, fd = digits
    for pid in range(3):
        a = rb.build(fd, pid, "digits", "client", "mean", "simple", seed=0)
        b = rb.build(fd, pid, "digits", "client", "mean", "simple", seed=0)
        c = rb.build(fd, pid, "digits", "client", "mean", "simple", seed=1)
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
        if a.n_augmented:
            assert not torch.equal(a.x, c.x)
        own = set(fd.pool.y[fd.train_idx[pid]].tolist())
        assert set(a.y.tolist()) == own
        assert torch.bincount(a.y).max() == torch.bincount(a.y)[torch.bincount(a.y) > 0].min()
        assert len(a.y) == a.target * len(own)


def make_client(digits, ablation="none", pid=0):
    cfg, fd = digits
    data = ALGORITHMS["fedreb"].client_data(cfg, fd, pid, "cpu")
    torch.manual_seed(0)
    model = build_model("digits-cnn", (1, 8, 8), 10, 2)
    settings = TrainSettings(1, 16, 0.05, 0.9, 0.0, 0)
    return FedRebClient(model, data, settings, pid, algo=FedRebSettings(ablation=ablation))


def heads(client):
    return [p.detach().clone() for p in client.model.head.parameters()], \
           [p.detach().clone() for p in client.personal.parameters()]


def test_stage1_leaves_h1_unchanged_and_stage2_leaves_h2_unchanged(digits):
    client = make_client(digits)
    s = client.settings
    base, h1, h2 = (list(m.parameters()) for m in (client.model.base, client.model.head,
                                                    client.personal))
    opt1 = torch.optim.SGD(base + h2, lr=s.lr, momentum=s.momentum)
    opt2 = torch.optim.SGD(base + h1, lr=s.lr, momentum=s.momentum)
    h1_before, h2_before = heads(client)
    client.stage1(opt1)
    h1_after, h2_after = heads(client)
    assert all(torch.equal(a, b) for a, b in zip(h1_before, h1_after, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(h2_before, h2_after, strict=True))
    client.stage2(opt2)
    h1_final, h2_final = heads(client)
    assert all(torch.equal(a, b) for a, b in zip(h2_after, h2_final, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(h1_after, h1_final, strict=True))


def test_upload_is_base_plus_h1_with_sample_counts_and_h2_stays(digits):
    client = make_client(digits)
    start = get_arrays(client.model)
    arrays, n, metrics = client.fit(start, {"server-round": 1})
    names = list(client.model.state_dict())
    assert len(arrays) == len(names) and all(n.startswith(("base.", "head.")) for n in names)
    assert n == len(client.data.y_train) and metrics["n-eff"] == client.data.n_eff
    h2 = get_arrays(client.personal)
    for a in arrays:  # no uploaded array is H2's
        assert not any(a.shape == b.shape and np.array_equal(a, b) for b in h2)
    saved = client.state[FedRebClient.state_key].to_numpy_ndarrays()
    assert all(np.array_equal(a, b) for a, b in zip(saved, h2, strict=True))


def test_h2_is_restored_from_context_state(digits):
    from flwr.common import Context, RecordDict

    client = make_client(digits)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    first = FedRebClient(client.model, client.data, client.settings, 0, context=ctx,
                         algo=client.algo)
    first.fit(get_arrays(client.model), {"server-round": 1})
    trained = get_arrays(first.personal)
    second = FedRebClient(build_model("digits-cnn", (1, 8, 8), 10, 2), client.data,
                          client.settings, 0, context=ctx, algo=client.algo)
    restored = get_arrays(second.personal)
    assert all(np.array_equal(a, b) for a, b in zip(restored, trained, strict=True))


def test_personal_prediction_sums_both_heads(digits):
    client = make_client(digits)
    with torch.no_grad():
        for p in client.personal.parameters():
            p.add_(torch.randn_like(p))
        x = client.data.x_test
        g, p = client.predict(x)
        z = client.model.base(x)
        assert torch.allclose(g, client.model.head(z))
        assert torch.allclose(p, client.model.head(z) + client.personal(z))


def test_split_average_hand_computed():
    # two clients, one base and one head layer; base weights n_orig = [1, 3],
    # head weights n_eff = [3, 1]
    m1 = [np.array([0.0], np.float32), np.array([0.0], np.float32)]
    m2 = [np.array([4.0], np.float32), np.array([4.0], np.float32)]
    out = split_average([m1, m2], [True, False], [1, 3], [3, 1])
    assert out[0][0] == pytest.approx(3.0)  # (1*0 + 3*4) / 4
    assert out[1][0] == pytest.approx(1.0)  # (3*0 + 1*4) / 4


def fit_res(pid, value, n, n_eff):
    arrays = [np.full(2, value, np.float32), np.full(3, value, np.float32)]
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n,
                  {"partition-id": pid, "n-eff": n_eff})


@pytest.mark.parametrize("algo, base, head", [
    ({"aggregation": "split"}, (10 * 1 + 30 * 5) / 40, (20 * 1 + 5 * 5) / 25),
    ({"aggregation": "origin"}, (10 * 1 + 30 * 5) / 40, (10 * 1 + 30 * 5) / 40),
    ({"aggregation": "split", "ablation": "a"}, 4.0, 4.0),
])
def test_strategy_split_and_origin_aggregation(algo, base, head):
    init = [np.zeros(2, np.float32), np.zeros(3, np.float32)]
    s = FedReb(initial_arrays=init, array_names=["base.0.weight", "head.0.weight"],
               num_rounds=1, num_clients=2, clients_per_round=2, seed=0,
               algo=build_settings(FedRebSettings, algo))
    s.open_step(1, 0, [0, 1])
    params, _ = s.aggregate_fit(1, [(None, fit_res(0, 1.0, 10, 20)),
                                    (None, fit_res(1, 5.0, 30, 5))], [])
    out = parameters_to_ndarrays(params)
    assert out[0] == pytest.approx(np.full(2, base))
    assert out[1] == pytest.approx(np.full(3, head))


def test_strategy_rejects_missing_or_bad_n_eff():
    init = [np.zeros(2, np.float32), np.zeros(3, np.float32)]
    s = FedReb(initial_arrays=init, num_rounds=1, num_clients=2, clients_per_round=2, seed=0)
    s.open_step(1, 0, [0, 1])
    bad = fit_res(0, 1.0, 10, 0)
    assert "n-eff" in s.check_upload(bad)
    bad.metrics.pop("n-eff")
    assert "n-eff" in s.check_upload(bad)


@pytest.mark.parametrize("override, message", [
    ("algo.threshold=min", "algo.threshold='min': allowed: mean, median, max, secmin"),
    ("algo.scope=world", "algo.scope='world': allowed: client, global"),
    ("algo.ablation=e", "algo.ablation='e': allowed: none, a, b, c, d"),
    ("model.head-depth=4", "model.head-depth=4: must be <= 3"),
])
def test_bad_fedreb_config_is_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        validate(load_config("fedreb-quick", [override]))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("ablation", ["b", "d"])
def test_ablations_b_and_d_predict_with_h1_alone(digits, ablation):
    # b has one head; d never runs stage 1, so its H2 never trains (issue 16 item 5)
    client = make_client(digits, ablation)
    with torch.no_grad():
        for p in client.personal.parameters():
            p.add_(torch.randn_like(p))
        x = client.data.x_test
        g, p = client.predict(x)
        h1 = client.model.head(client.model.base(x))
        assert torch.allclose(g, h1) and torch.allclose(p, h1)


@pytest.mark.parametrize("ablation, head_weight", [("b", "n_orig"), ("c", "n_orig"),
                                                   ("d", "n_eff")])
def test_ablation_aggregation_weights_hand_computed(digits, ablation, head_weight):
    """Two clients train in-process and upload; the server's base is their n_orig-weighted
    mean, H1 the n_eff-weighted one (d, as without ablation) or the n_orig-weighted one (b: the
    whole model by origin weights; c: H1 trained on D_o, whose n_eff is n_orig)."""
    clients = [make_client(digits, ablation, pid) for pid in (0, 1)]
    start = get_arrays(clients[0].model)
    names = list(clients[0].model.state_dict())
    results, n_orig, n_eff = [], [], []
    for c in clients:
        arrays, n, metrics = c.fit(start, {"server-round": 1})
        assert n == len(c.data.y_train)
        results.append((None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n,
                                     {"partition-id": c.partition_id, **metrics})))
        n_orig.append(n)
        n_eff.append(c.data.n_eff)
    assert n_eff != n_orig  # the digits clients tell the two weightings apart
    s = FedReb(initial_arrays=start, array_names=names, num_rounds=1, num_clients=2,
               clients_per_round=2, seed=0, algo=FedRebSettings(ablation=ablation))
    s.open_step(1, 0, [0, 1])
    params, _ = s.aggregate_fit(1, results, [])
    out = parameters_to_ndarrays(params)
    uploads = [parameters_to_ndarrays(r.parameters) for _, r in results]
    for i, name in enumerate(names):
        w = n_orig if name.startswith("base.") or head_weight == "n_orig" else n_eff
        expected = (w[0] * uploads[0][i].astype(np.float64)
                    + w[1] * uploads[1][i].astype(np.float64)) / (w[0] + w[1])
        np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-6, err_msg=name)
