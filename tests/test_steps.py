"""Steps within a round: the (round, step) clock, a multi-step algorithm (Fed-Cyclic's relay)
run through Flower's call sequence in process, evaluation only after a round's last step, and
a resume from the middle of a round that ends with bit-identical numbers."""

import numpy as np
import pytest

from clients.arrays import get_arrays
from clients.fedavg import FedAvgClient
from fedapps.runtime import make_model, train_settings
from strategies.fedcyclic import FedCyclic, FedCyclicSettings
from strategies.steps import StepClock
from tests.inprocess import digits_setup, run

NUM_CLIENTS, HOPS = 4, 3


def test_clock_maps_flower_rounds_to_round_and_step():
    clock = StepClock(3, lambda r: [2, 1, 3][r - 1])
    assert clock.total == 6
    assert [clock.locate(k) for k in range(1, 7)] == [(1, 0), (1, 1), (2, 0), (3, 0), (3, 1),
                                                      (3, 2)]
    assert [clock.index(r, s) for r, s in [(1, 0), (1, 1), (2, 0), (3, 2)]] == [1, 2, 3, 6]
    assert clock.is_last(1, 1) and not clock.is_last(3, 1)
    with pytest.raises(ValueError, match="outside"):
        clock.locate(7)
    with pytest.raises(ValueError, match="at least one step"):
        StepClock(2, lambda r: 0)


@pytest.fixture(scope="module")
def setup():
    return digits_setup(NUM_CLIENTS)


def build(setup, **kw):
    cfg, fd = setup
    model = make_model(cfg)
    strategy = FedCyclic(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                         num_rounds=2, num_clients=NUM_CLIENTS, clients_per_round=HOPS, seed=0,
                         algo=FedCyclicSettings(), **kw)
    clients = {pid: FedAvgClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid)
               for pid in range(NUM_CLIENTS)}
    return strategy, clients


def test_relay_hops_are_steps_and_only_the_last_step_evaluates(setup):
    records, snaps = [], []
    s, clients = build(setup, on_round=records.append, on_checkpoint=snaps.append)
    assert s.flower_rounds() == 2 * HOPS
    evaluated = run(s, clients, s.flower_rounds())
    assert evaluated == [0, 0, NUM_CLIENTS] * 2  # all clients evaluate after the last hop
    assert [r["round"] for r in records] == [1, 2] and all(r["steps"] == HOPS for r in records)
    everyone = list(range(NUM_CLIENTS))
    assert s.relay_order(1, everyone) == s.relay_order(2, everyone)  # the order is kept
    assert sorted(s.relay_order(1, everyone)) == everyone
    one_model = sum(a.nbytes for a in s.global_arrays)
    assert records[0]["bytes_down"] == pytest.approx(HOPS * one_model, rel=0.01)
    assert records[0]["fit_instructions"] == HOPS and records[0]["bytes_down_xeval"] == 0
    # a checkpoint after every step; inside a round it carries the open round's counters
    assert [(c.round, c.step) for c in snaps] == [(1, 0), (1, 1), (1, None),
                                                  (2, 0), (2, 1), (2, None)]
    assert snaps[1].open_round and snaps[2].open_round is None


def test_the_relay_passes_the_model_on_without_averaging(setup):
    s, clients = build(setup)
    run(s, clients, 1)  # one hop: the global model is that client's trained model
    plan = s.current_plan
    hop = plan.assignments[0].partition_id
    assert plan.step == 0 and not plan.last_step
    fresh, fresh_clients = build(setup)
    arrays, _, _ = fresh_clients[hop].fit(fresh.global_arrays, {"server-round": 1})
    assert all(np.array_equal(a, b) for a, b in zip(s.global_arrays, arrays, strict=True))


def test_resume_in_the_middle_of_a_round_gives_the_same_numbers(setup):
    records, snaps = [], []
    s, clients = build(setup, on_round=records.append, on_checkpoint=snaps.append)
    run(s, clients, s.flower_rounds())
    mid = snaps[4]  # after step 2 of round 2
    assert (mid.round, mid.step) == (2, 1)
    resumed_records = []
    r, r_clients = build(setup, on_round=resumed_records.append)
    r.resume(mid)
    assert r.flower_rounds() == 1
    run_from = r.steps_done  # Flower counts from 1 again after a restart
    assert run_from == HOPS + 2
    run(r, r_clients, r.flower_rounds())
    assert all(np.array_equal(a, b) for a, b in zip(r.global_arrays, s.global_arrays,
                                                    strict=True))
    (after,) = resumed_records
    before = records[1]
    for key in ("round", "global_accuracy", "personal_accuracy", "fit_clients", "bytes_down",
                "bytes_up", "steps", "fit_instructions", "client_global_accuracy"):
        assert after[key] == before[key], key
