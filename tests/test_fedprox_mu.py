"""FedProx with automatic mu (seed 002 baseline): the schedule on a hand-written loss sequence,
fixed mode unchanged, mu sent by the server and kept in the checkpoint."""

import numpy as np
import pytest
import torch
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays

from clients.arrays import get_arrays
from clients.base import TrainSettings
from clients.fedprox import FedProxClient, FedProxSettings
from fedapps.data import ClientData
from fedapps.models import build_model
from strategies.fedavg import FedAvg
from strategies.fedprox import STATE, FedProx, MuState, next_mu

# FedProxClient of 963c1b2 (before auto mu) on the data below, algo.mu 0.3: mean training loss
# and the sum of all uploaded entries
PINNED_LOSS, PINNED_SUM = 1.9541341463724773, 41.20415375102016


def test_schedule_on_a_hand_written_loss_sequence():
    losses = [1.0, 1.2,                      # first loss sets the reference; rise: +0.1
              1.1, 1.0, 0.9, 0.8, 0.7,       # 5 falls: -0.1
              0.6, 0.5, 0.4, 0.3, 0.2,       # 5 more falls: mu stays at 0
              0.3,                           # rise: +0.1
              0.3,                           # equal: neither, breaks the run of falls
              0.2, 0.1, 0.05, 0.04,          # 4 falls: not yet
              0.5, 0.6]                      # rises: +0.1 each
    expected = [0.0, 0.1,
                0.1, 0.1, 0.1, 0.1, 0.0,
                0.0, 0.0, 0.0, 0.0, 0.0,
                0.1,
                0.1,
                0.1, 0.1, 0.1, 0.1,
                0.2, 0.3]
    state, mus = MuState(0.0), []
    for loss in losses:
        state = next_mu(state, loss)
        mus.append(state.mu)
    assert mus == pytest.approx(expected)


def data():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    return ClientData(x[:24], y[:24], x[24:], y[24:])


def fit(algo, config):
    torch.manual_seed(0)
    c = FedProxClient(build_model("digits-cnn", (1, 8, 8), 10, 2), data(),
                      TrainSettings(2, 8, 0.05, 0.9, 0.0, 0), 0, algo=algo)
    return c.fit(get_arrays(c.model), {"server-round": 1, **config})


def test_fixed_mode_gives_the_numbers_of_fedprox_before_auto_mu():
    """Pinned from /work/main 963c1b2's FedProxClient (no mu in the config, algo.mu 0.3)."""
    out, n, metrics = fit(FedProxSettings(mu=0.3), {})
    assert n == 24
    assert metrics["train-loss"] == pytest.approx(PINNED_LOSS, abs=1e-6)
    assert sum(float(np.sum(a, dtype=np.float64)) for a in out) == pytest.approx(
        PINNED_SUM, abs=1e-5)
    # the server's fit config carries mu: the same value gives the same model
    sent, _, _ = fit(FedProxSettings(mu=0.3), {"mu": 0.3})
    assert all(np.array_equal(a, b) for a, b in zip(out, sent, strict=True))


def test_config_mu_overrides_the_setting_and_task_loss_leaves_the_prox_term_out():
    a, _, ma = fit(FedProxSettings(mu=0.0), {"mu": 2.0})
    b, _, mb = fit(FedProxSettings(mu=2.0), {})
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)) and ma["mu"] == 2.0
    assert mb["task-loss"] < mb["train-loss"]
    _, _, m0 = fit(FedProxSettings(mu=0.0), {})
    assert m0["task-loss"] == pytest.approx(m0["train-loss"], rel=1e-6)


def res(pid, value, n, loss):
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.array([value], np.float32)]),
                  n, {"partition-id": pid, "task-loss": loss, "train-loss": loss + 1})


def strategy(cls=FedProx, **algo):
    return cls(initial_arrays=[np.zeros(1, np.float32)], num_rounds=10, num_clients=4,
               clients_per_round=2, seed=0, algo=FedProxSettings(**algo) if algo else None)


def run_round(s, r, losses):
    plan = s.open_step(r, 0, [0, 1])
    results = [res(i, float(i + 1), n, loss) for i, (n, loss) in
               enumerate(zip((30, 10), losses, strict=True))]
    out = parameters_to_ndarrays(s.aggregate_fit(r, [(None, x) for x in results], [])[0])
    s.finish_round(r, {})
    return plan, out


def test_fixed_mode_strategy_aggregates_as_fedavg_and_keeps_mu():
    s, avg = strategy(mu=0.3), strategy(FedAvg)
    plan, out = run_round(s, 1, (1.0, 1.0))
    _, ref = run_round(avg, 1, (1.0, 1.0))
    assert np.array_equal(out[0], ref[0])  # (30 * 1 + 10 * 2) / 40
    assert all(a.config["mu"] == 0.3 for a in plan.assignments)
    run_round(s, 2, (5.0, 5.0))
    assert s.mu_state.mu == 0.3


def test_auto_mode_tracks_the_weighted_task_loss_and_survives_a_checkpoint():
    s = strategy(mu=0.0, mu_mode="auto")
    assert "task-loss" in s.validate_metrics({"train-loss": 1.0})
    run_round(s, 1, (1.0, 3.0))  # weighted loss (30 * 1 + 10 * 3) / 40 = 1.5
    assert s.mu_state == MuState(0.0, 1.5, 0)
    run_round(s, 2, (1.0, 4.0))  # 1.75 > 1.5: +0.1
    plan, _ = run_round(s, 3, (1.0, 3.8))  # 1.7 < 1.75: one fall
    assert all(a.config["mu"] == pytest.approx(0.1) for a in plan.assignments)
    assert s.mu_state == MuState(pytest.approx(0.1), pytest.approx(1.7), 1)
    resumed = strategy(mu=0.0, mu_mode="auto")
    resumed.load_state_arrays({STATE: s.state_arrays()[STATE]})
    assert resumed.mu_state == s.mu_state
    for t in (s, resumed):
        run_round(t, 4, (1.0, 3.7))
    assert resumed.mu_state == s.mu_state and s.mu_state.decreases == 2
