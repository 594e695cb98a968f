"""FedNova (seed 002 baseline): a_i, tau_eff and the normalized step, checked by value."""

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients.arrays import get_arrays
from clients.base import TrainSettings
from clients.fedavg import FedAvgClient
from clients.fednova import FedNovaClient, FedNovaSettings
from fedapps.data import ClientData
from fedapps.models import build_model
from strategies.aggregation import fednova_update, nova_normalizer, weighted_average
from strategies.fedavg import FedAvg
from strategies.fednova import BUFFER, FedNova


def test_normalizer_hand_computed():
    assert nova_normalizer(7, 0.0) == 7.0  # plain SGD: a_i = tau_i
    # rho 0.5: counters 1, 1.5, 1.75 -> a = 4.25
    assert nova_normalizer(3, 0.5) == pytest.approx(4.25)
    # closed form sum_t (1 - rho^t) / (1 - rho)
    rho, tau = 0.9, 12
    assert nova_normalizer(tau, rho) == pytest.approx(
        sum((1 - rho ** t) / (1 - rho) for t in range(1, tau + 1)))


@pytest.mark.parametrize("rho", [0.0, 0.9])
def test_normalizer_is_the_weight_torch_momentum_sgd_gives_a_constant_gradient(rho):
    # loss = sum(w): gradient 1 at every step, so w_0 - w_tau = lr * a(tau, rho)
    w = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1, momentum=rho)
    for _ in range(6):
        opt.zero_grad()
        w.sum().backward()
        opt.step()
    np.testing.assert_allclose(-w.detach().numpy(), 0.1 * nova_normalizer(6, rho), rtol=1e-6)


def models():
    rng = np.random.default_rng(0)
    start = [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=4).astype(np.float32)]
    clients = [[a + rng.normal(size=a.shape).astype(np.float32) for a in start]
               for _ in range(3)]
    return start, clients


def test_equal_steps_give_fedavg():
    start, clients = models()
    n = [10, 30, 5]
    new, buffer = fednova_update(start, clients, n, [4.25] * 3)
    for a, b in zip(new, weighted_average(clients, n), strict=True):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert buffer is None


def test_unequal_steps_two_clients_hand_computed():
    start = [np.array([1.0], np.float32), np.array([2.0], np.float32)]
    # client 0: 3 samples, a = 1, moved by 1; client 1: 1 sample, a = 4, moved by 2
    clients = [[np.array([0.0], np.float32), np.array([0.0], np.float32)],
               [np.array([-1.0], np.float32), np.array([4.0], np.float32)]]
    new, _ = fednova_update(start, clients, [3, 1], [1.0, 4.0], normalized=[True, False])
    # p = (0.75, 0.25); d = 0.75 * 1 / 1 + 0.25 * 2 / 4 = 0.875; tau_eff = 0.75 + 1 = 1.75
    # w = 1 - 1.75 * 0.875 = -0.53125 (FedAvg: -0.25)
    np.testing.assert_allclose(new[0], [-0.53125])
    np.testing.assert_allclose(new[1], [1.0])  # not normalized: 0.75 * 0 + 0.25 * 4


def test_global_momentum_two_rounds_hand_computed():
    start = [np.array([1.0])]
    lr, gmf = 0.5, 0.9
    # round 1: step = 0.5 -> v = 0.5 / 0.5 = 1, w = 1 - 0.5 * 1 = 0.5 (no momentum yet)
    new, v = fednova_update(start, [[np.array([0.5])]], [1], [2.0], gmf=gmf, lr=lr)
    np.testing.assert_allclose(new[0], [0.5])
    np.testing.assert_allclose(v[0], [1.0])
    # round 2: step = 0.25 -> v = 0.9 * 1 + 0.25 / 0.5 = 1.4, w = 0.5 - 0.5 * 1.4 = -0.2
    new, v = fednova_update(new, [[np.array([0.25])]], [1], [2.0], momentum_buffer=v,
                            gmf=gmf, lr=lr)
    np.testing.assert_allclose(v[0], [1.4])
    np.testing.assert_allclose(new[0], [-0.2])


def fit_res(pid, arrays, n, tau, a, lr=0.5):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n,
                  {"partition-id": pid, "local-steps": tau, "normalizer": a, "lr": lr})


def strategy(cls, **kwargs):
    start, _ = models()
    return cls(initial_arrays=start, num_rounds=2, num_clients=4, clients_per_round=3, seed=0,
               **kwargs)


def aggregate(s, results):
    s.open_step(1, 0, [r.metrics["partition-id"] for r in results])
    return parameters_to_ndarrays(s.aggregate_fit(1, [(None, r) for r in results], [])[0])


def test_strategy_equal_steps_match_the_fedavg_strategy():
    _, clients = models()
    results = [fit_res(i, c, n, 6, nova_normalizer(6, 0.9)) for i, (c, n)
               in enumerate(zip(clients, [10, 30, 5], strict=True))]
    nova = aggregate(strategy(FedNova, algo=FedNovaSettings()), results)
    avg = aggregate(strategy(FedAvg), results)
    for a, b in zip(nova, avg, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_strategy_rejects_missing_step_counts_and_checkpoints_the_momentum():
    s = strategy(FedNova, algo=FedNovaSettings(gmf=0.5))
    assert "local-steps" in s.validate_metrics({"normalizer": 1.0, "lr": 0.1})
    assert "normalizer" in s.validate_metrics({"local-steps": 3, "normalizer": 0.0})
    _, clients = models()
    aggregate(s, [fit_res(0, clients[0], 10, 2, 2.0), fit_res(1, clients[1], 10, 4, 4.0)])
    saved = s.state_arrays()[BUFFER]
    assert any(np.any(v != 0) for v in saved)
    fresh = strategy(FedNova, algo=FedNovaSettings(gmf=0.5))
    fresh.load_state_arrays({BUFFER: saved})
    assert all(np.array_equal(a, b) for a, b in zip(fresh.buffer, saved, strict=True))


def test_client_trains_as_fedavg_and_reports_its_steps():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(30, 1, 8, 8, generator=g), torch.randint(0, 4, (30,), generator=g)
    data = ClientData(x[:22], y[:22], x[22:], y[22:])
    settings = TrainSettings(2, 8, 0.05, 0.9, 0.0, 0)  # 22 samples, batch 8: 3 steps/epoch

    def run(cls, **kw):
        torch.manual_seed(0)
        c = cls(build_model("digits-cnn", (1, 8, 8), 10, 2), data, settings, 0, **kw)
        return c.fit(get_arrays(c.model), {"server-round": 1})

    nova, _, metrics = run(FedNovaClient, algo=FedNovaSettings())
    avg, _, _ = run(FedAvgClient)
    assert all(np.array_equal(a, b) for a, b in zip(nova, avg, strict=True))
    assert metrics["local-steps"] == 6
    assert metrics["normalizer"] == pytest.approx(nova_normalizer(6, 0.9))
    assert metrics["lr"] == 0.05


@pytest.mark.integration
def test_real_simulation_on_digits_normalizes_unequal_steps(tmp_path):
    from tests.test_simulation import run as run_cli

    _, doc = run_cli(tmp_path, "quickstart", "nova", "rounds=2", "algorithm=fednova")
    assert [r["round"] for r in doc["rounds"]] == [1, 2]
    for r in doc["rounds"]:
        fits = r["client_fit_metrics"].values()
        taus = {m["local-steps"] for m in fits}
        assert len(taus) > 1  # Dirichlet sizes: unequal local work, so not FedAvg
        for m in fits:
            assert m["normalizer"] == pytest.approx(nova_normalizer(m["local-steps"], 0.9))
    assert doc["summary"]["final_global_accuracy"] > 0.15  # above chance (0.1)
