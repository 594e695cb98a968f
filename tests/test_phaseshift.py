"""Phase-shift (seed 002 Ch. 4): the queue and roles by value, the drift-correction merge on a
client whose local model survives a restart, the epoch-reduction step count, n = 1 equal to
FedAvg bit for bit, only the returning group averaged, and the (n+1)/(2n) traffic ratio
against FedAvg in the round records (in process and in a real simulation)."""

import dataclasses
from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest

from clients.arrays import get_arrays
from clients.fedavg import FedAvgClient
from clients.phaseshift import PhaseShiftClient, PhaseShiftSettings
from fedapps.config import load_config
from fedapps.data import ClientData
from fedapps.errors import ConfigError
from fedapps.runtime import make_model, train_settings
from fedapps.validation import validate
from strategies.aggregation import weighted_average
from strategies.fedavg import FedAvg
from strategies.phases import (
    CORRECT,
    FRESH,
    FRESH_RETURN,
    RETURN,
    drift_correction,
    epoch_scale,
    group_sizes,
    local_steps,
    phase_queue,
    phase_role,
    transfer_ratio,
)
from strategies.phaseshift import PhaseShift
from strategies.sampling import sample_clients
from tests.inprocess import digits_setup, run

K = 8


def same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# ---- the queue and the roles (pure) ---------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 4])
def test_full_participation_locks_the_groups_and_shifts_them_one_position_a_round(n):
    queues = [phase_queue(0, K, K, n, t) for t in range(1, 7)]
    for q in queues:
        assert sorted(p for g in q for p in g) == list(range(K))  # disjoint, every client
        assert [len(g) for g in q] == [K // n] * n
    for prev, cur in pairwise(queues):
        assert cur[1:] == prev[:-1]  # every group one position older
        assert cur[0] == prev[-1]  # the returned group starts again (locked from round 1)


def test_partial_participation_draws_the_newest_group_from_outside_the_queue():
    for t in range(2, 10):
        prev, cur = phase_queue(3, 10, 6, 3, t - 1), phase_queue(3, 10, 6, 3, t)
        assert cur[1:] == prev[:-1] and [len(g) for g in cur] == [2, 2, 2]
        assert not set(cur[0]) & {p for g in prev[:-1] for p in g}
    seen = {p for t in range(1, 30) for g in phase_queue(3, 10, 6, 3, t) for p in g}
    assert seen == set(range(10))  # groups rotate through the federation
    # any count >= n: near-equal groups whose sizes always sum to the clients per round
    assert group_sizes(5, 2) == [3, 2] and group_sizes(8, 4) == [2, 2, 2, 2]
    assert all(sum(map(len, phase_queue(0, 10, 5, 2, t))) == 5 for t in range(1, 6))


def test_one_phase_draws_fedavgs_clients():
    for t in range(1, 6):
        assert phase_queue(7, 10, 4, 1, t) == [sample_clients(7, t, range(10), 4)]


def test_roles_newest_fresh_oldest_returns_and_the_last_round_collects_all():
    assert [phase_role(i, 4, False) for i in range(4)] == [FRESH, CORRECT, CORRECT, RETURN]
    assert [phase_role(i, 2, False) for i in range(2)] == [FRESH, RETURN]  # no pure correction
    assert [phase_role(i, 4, True) for i in range(4)] == [FRESH_RETURN, RETURN, RETURN, RETURN]
    assert phase_role(0, 1, False) == FRESH_RETURN  # n = 1: FedAvg


def test_drift_correction_weights_the_server_model_by_N_and_the_local_one_by_n_k():
    server, local = [np.array([1.0, 2.0], np.float32)], [np.array([3.0, 6.0], np.float32)]
    (merged,) = drift_correction(server, local, 30, 10)  # 3/4 * server + 1/4 * local
    assert merged.dtype == np.float32 and merged.tolist() == [1.5, 3.0]
    (kept,) = drift_correction(server, local, 0, 10)  # round 1: N = 0 keeps the local model
    assert kept.tolist() == [3.0, 6.0]


def test_table_4_5_and_table_6_1_follow_from_the_transfer_ratio():
    phases = [1, 2, 4, 5, 10, 20]
    assert [round(100 * (1 - transfer_ratio(n)), 1) for n in phases] == [0, 25, 37.5, 40, 45,
                                                                          47.5]
    # FedAvg's E for the same saving, base E = 8 (Table 4.5, one decimal)
    assert [round(8 / transfer_ratio(n), 1) for n in phases] == [8, 10.7, 12.8, 13.3, 14.5,
                                                                  15.2]
    assert 12 * epoch_scale(2, "epoch") == 9  # Table 6.1: 2P at E = 9 against E = 12
    assert epoch_scale(4, "communication") == 1 and epoch_scale(1, "epoch") == 1


def test_local_steps_of_fractional_epochs():
    assert local_steps(9, 100, 16) == 9 * 7  # integer E: the epoch loop's minibatches
    assert local_steps(1.5, 100, 16) == 11  # 10.5 rounds half up
    assert local_steps(8 * 0.6, 100, 16) == 34  # 5 phases, E = 8: 4.8 epochs of 7 batches
    assert local_steps(0.01, 10, 16) == 1


# ---- clients ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def setup():
    return digits_setup(K)


def test_steps_option_repeats_the_epoch_loop_and_stops_mid_epoch(setup):
    cfg, fd = setup
    by_epochs, by_steps = (FedAvgClient(make_model(cfg), fd.client(0), train_settings(cfg), 0)
                           for _ in range(2))
    per_epoch = -(-len(fd.client(0).y_train) // train_settings(cfg).batch_size)
    calls = []
    for client, kw in ((by_epochs, {"epochs": 2}), (by_steps, {"epochs": 0,
                                                               "steps": 2 * per_epoch})):
        client.seed_generator({"server-round": 1}, stream=0)
        client.sgd_epochs(client.model.parameters(), client.task_loss(client.model), **kw)
    assert same(get_arrays(by_epochs.model), get_arrays(by_steps.model))

    def counting(x, y):
        calls.append(len(y))
        return by_steps.task_loss(by_steps.model)(x, y)

    by_steps.sgd_epochs(by_steps.model.parameters(), counting, 0, steps=per_epoch + 2)
    assert len(calls) == per_epoch + 2


def test_fedavg_trains_a_fractional_e_as_the_step_budget_of_phase_shift(setup):
    """Table 4.5's FedAvg at E = 10.7 (seed 002): train.local-epochs takes a fraction, run as
    round(E x ceil(n/B)) minibatches, the same batches as the steps option."""
    cfg, fd = setup
    frac = dataclasses.replace(train_settings(cfg), local_epochs=2.4)
    client = FedAvgClient(make_model(cfg), fd.client(0), frac, 0)
    by_steps = FedAvgClient(make_model(cfg), fd.client(0), train_settings(cfg), 0)
    n, b = len(fd.client(0).y_train), frac.batch_size
    budget = local_steps(2.4, n, b)
    assert budget == int(2.4 * -(-n // b) + 0.5) and budget % -(-n // b) != 0  # mid-epoch
    seen = []
    loss = client.task_loss(client.model)
    client.seed_generator({"server-round": 1}, stream=0)
    client.sgd_epochs(client.model.parameters(), lambda x, y: seen.append(len(y)) or loss(x, y),
                      frac.local_epochs)
    assert len(seen) == budget
    by_steps.seed_generator({"server-round": 1}, stream=0)
    by_steps.sgd_epochs(by_steps.model.parameters(), by_steps.task_loss(by_steps.model), 0,
                        steps=budget)
    assert same(get_arrays(client.model), get_arrays(by_steps.model))
    # through the config: the whole fit, and a whole number stays the epoch loop
    assert train_settings(validated("quickstart", "train.local-epochs=10.7")).local_epochs \
        == 10.7
    assert type(train_settings(validated("quickstart", "train.local-epochs=2.0")).local_epochs) \
        is int
    with pytest.raises(ConfigError, match="must be > 0"):
        validated("quickstart", "train.local-epochs=0")
    with pytest.raises(ConfigError, match="interleaved stages alternate whole epochs"):
        validated("fedreb-quick", "train.local-epochs=1.5")


def validated(experiment, *overrides):
    cfg = load_config(experiment, list(overrides))
    validate(cfg)
    return cfg


def phase_client(setup, pid, tmp_path, **algo):
    cfg, fd = setup
    frozen = dataclasses.replace(train_settings(cfg), lr=0.0)  # training leaves w unchanged
    return PhaseShiftClient(make_model(cfg), fd.client(pid), frozen, pid,
                            algo=PhaseShiftSettings(**algo), state_dir=tmp_path)


def test_the_local_model_persists_on_disk_and_is_merged_with_the_server_model(setup,
                                                                               tmp_path):
    cfg, _ = setup
    w_a = get_arrays(make_model(cfg))
    w_b = [a + 1.0 for a in w_a]
    arrays, n_k, metrics = phase_client(setup, 0, tmp_path, phases=2).fit(
        w_a, {"server-round": 1, "phase-role": FRESH, "phase-n": 0})
    assert arrays == [] and metrics["phase-role"] == FRESH  # a fresh group uploads nothing
    restarted = phase_client(setup, 0, tmp_path, phases=2)  # empty node state: disk only
    arrays, _, metrics = restarted.fit(w_b, {"server-round": 2, "phase-role": RETURN,
                                             "phase-n": 30})
    assert same(arrays, drift_correction(w_b, w_a, 30, n_k))
    assert metrics["state-from-disk"] == 1 and metrics["phase-state-lost"] == 0
    lost = phase_client(setup, 0, tmp_path / "elsewhere", phases=2)
    arrays, _, metrics = lost.fit(w_b, {"server-round": 2, "phase-role": RETURN, "phase-n": 30})
    assert same(arrays, w_b) and metrics["phase-state-lost"] == 1  # restarts from w_t


def test_epoch_mode_trains_n_plus_one_over_two_n_of_the_epochs(setup, tmp_path):
    cfg, fd = setup
    per_epoch = -(-len(fd.client(1).y_train) // train_settings(cfg).batch_size)
    config = {"server-round": 1, "phase-role": FRESH, "phase-n": 0}
    for mode, steps in (("communication", per_epoch), ("epoch", int(0.75 * per_epoch + 0.5))):
        _, _, metrics = phase_client(setup, 1, tmp_path, phases=2, mode=mode).fit(
            get_arrays(make_model(cfg)), config)
        assert metrics["local-steps"] == steps


def test_fedaug_copies_count_in_the_step_budget_only_under_reading_b(setup, tmp_path):
    """2P-FedAug: reading (a) (`epoch_samples` = N_orig) budgets ceil(N_orig / B) steps an
    epoch, reading (b) (no budget) every row, copies included; weights stay N_orig either way."""
    cfg, fd = setup
    data, b = fd.client(1), train_settings(cfg).batch_size
    rows, n_orig = len(data.y_train), len(data.y_train) // 2  # as if half were FedAug's copies
    config = {"server-round": 1, "phase-role": FRESH_RETURN, "phase-n": 0}
    for extras, epoch in (({"n_orig": n_orig, "epoch_samples": n_orig}, n_orig),
                          ({"n_orig": n_orig}, rows)):
        for mode, scale in (("communication", 1.0), ("epoch", 0.75)):
            client = PhaseShiftClient(
                make_model(cfg), ClientData(data.x_train, data.y_train, data.x_test,
                                            data.y_test, extras),
                train_settings(cfg), 1, algo=PhaseShiftSettings(phases=2, mode=mode),
                state_dir=tmp_path)
            _, n_k, metrics = client.fit(get_arrays(make_model(cfg)), config)
            assert metrics["local-steps"] == local_steps(scale, epoch, b) and n_k == n_orig
    assert local_steps(1.0, rows, b) > local_steps(1.0, n_orig, b)  # the readings differ


def test_phases_must_not_exceed_the_clients_per_round():
    validate(load_config("quickstart", ["algorithm=phase-shift", "algo.phases=5"]))
    with pytest.raises(ConfigError, match=r"^algo.phases=6: must be <= the clients per round "
                                          r"\(5, "):
        validate(load_config("quickstart", ["algorithm=phase-shift", "algo.phases=6"]))


# ---- in process: n = 1 is FedAvg, only the returning group counts, traffic -------------------
def build(setup, phases, rounds=3, clients_per_round=K, **kw):
    """FedAvg (phases None) or phase-shift with its clients, all from the seeded model."""
    cfg, fd = setup
    model = make_model(cfg)
    args = dict(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                num_rounds=rounds, num_clients=K, clients_per_round=clients_per_round, seed=0,
                **kw)
    if phases is None:
        return FedAvg(**args), {pid: FedAvgClient(make_model(cfg), fd.client(pid),
                                                  train_settings(cfg), pid) for pid in range(K)}
    algo = PhaseShiftSettings(phases=phases)
    return PhaseShift(algo=algo, **args), {
        pid: PhaseShiftClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid,
                              algo=algo) for pid in range(K)}


@pytest.fixture(scope="module")
def fedavg_run(setup):
    records = []
    s, clients = build(setup, None, on_round=records.append)
    run(s, clients, 3)
    return s, records


def test_one_phase_gives_fedavgs_numbers_bit_for_bit(setup):
    records, ref_records = [], []
    ref, ref_clients = build(setup, None, clients_per_round=3, on_round=ref_records.append)
    s, clients = build(setup, 1, clients_per_round=3, on_round=records.append)
    run(ref, ref_clients, 3)
    run(s, clients, 3)
    assert same(s.global_arrays, ref.global_arrays)
    for a, b in zip(records, ref_records, strict=True):
        for key in ("global_accuracy", "fit_clients", "bytes_down", "bytes_up", "loss"):
            assert a[key] == b[key], key


def test_the_server_averages_only_the_returning_group(setup):
    s, clients = build(setup, 2)
    run(s, clients, 1)
    fresh, returning = s.queue(1)
    _, clean = build(setup, 2)  # the same clients before any training
    answers = [clean[pid].fit(get_arrays(make_model(setup[0])), {
        "server-round": 1, "phase-role": RETURN, "phase-n": 0}) for pid in returning]
    assert same(s.global_arrays, weighted_average([a for a, _, _ in answers],
                                                  [n for _, n, _ in answers]))
    assert s.returned_examples == sum(n for _, n, _ in answers)
    assert all(clients[pid].load_state("phase-model") is not None for pid in fresh)
    restored, _ = build(setup, 2)
    restored.load_state_arrays(s.state_arrays())  # N travels in the checkpoint
    assert restored.returned_examples == s.returned_examples


@pytest.mark.parametrize("n", [2, 4])
def test_traffic_per_round_is_n_plus_one_over_two_n_of_fedavgs(setup, fedavg_run, n):
    _, ref = fedavg_run
    records = []
    s, clients = build(setup, n, on_round=records.append)
    run(s, clients, 3)
    ratios = [Fraction(r["bytes_down"] + r["bytes_up"], f["bytes_down"] + f["bytes_up"])
              for r, f in zip(records, ref, strict=True)]
    assert ratios == [Fraction(n + 1, 2 * n)] * 2 + [1]  # the last round collects every client
    roles = [m["phase-role"] for m in records[0]["client_fit_metrics"].values()]
    assert roles.count(RETURN) == K // n and roles.count(FRESH) == K // n
    assert records[-1]["global_accuracy"] > 0.3  # chance is 0.1


# ---- a real simulation -----------------------------------------------------------------------
@pytest.mark.integration
def test_real_simulation_keeps_local_models_and_shows_the_traffic_ratio(tmp_path):
    from tests.test_simulation import run as run_cli

    _, doc = run_cli(tmp_path, "quickstart", "ps", "rounds=3", "algorithm=phase-shift",
                     "algo.phases=2", "federation.clients-per-round=4", "train.local-epochs=1")
    rounds = doc["rounds"]
    assert [2 * r["bytes_up"] for r in rounds[:2]] == [r["bytes_down"] for r in rounds[:2]]
    assert rounds[-1]["bytes_up"] == rounds[-1]["bytes_down"]  # all upload in the last round
    for r in rounds:
        assert r["failures"] == 0 and len(r["fit_clients"]) == 4
        assert all(m["phase-state-lost"] == 0 for m in r["client_fit_metrics"].values())
    assert doc["summary"]["final_global_accuracy"] > 0.15
