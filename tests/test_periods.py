"""Fed-Star and RingFed through Flower's call sequence in process (tests/inprocess.py): 2P resp.
P steps per round and one record, each client training from its own model, pre-aggregates
against values computed here from the clients' own train accuracies, the server's data-size
aggregation, peer-model traffic, and a resume from the middle of a round with bit-identical
arrays and records."""

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters

from clients.arrays import get_arrays
from clients.peer import PeerClient
from fedapps.config import load_config
from fedapps.errors import ConfigError
from fedapps.models import frozen_names
from fedapps.runtime import make_model, train_settings
from fedapps.validation import validate
from strategies.fedstar import FedStar, FedStarSettings
from strategies.ringfed import RingFed, RingFedSettings
from tests.inprocess import digits_setup, run, train_accuracy

N, ROUNDS = 3, 2


@pytest.fixture(scope="module")
def setup():
    return digits_setup(N)


FROZEN = ["base.0.0.weight", "base.0.0.bias"]  # the digits CNN's conv layer


def frozen_model(cfg):
    model = make_model(cfg)
    model.base[0].requires_grad_(False)
    return model


def build(setup, cls=FedStar, settings=None, freeze=False, **kw):
    """Strategy and clients; `freeze` freezes the conv layer (a transfer model's features)."""
    cfg, fd = setup
    new = frozen_model if freeze else make_model
    model = new(cfg)
    settings = settings or (FedStarSettings() if cls is FedStar else RingFedSettings())
    strategy = cls(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                   num_rounds=ROUNDS, num_clients=N, clients_per_round=N, seed=0,
                   algo=settings, frozen=frozen_names(model), **kw)
    clients = {pid: PeerClient(new(cfg), fd.client(pid), train_settings(cfg), pid,
                               algo=settings)
               for pid in range(N)}
    return strategy, clients


def combine(models, weights):
    return [sum(w * m[i].astype(np.float64) for w, m in zip(weights, models, strict=True))
            for i in range(len(models[0]))]


def close(a, b):
    return all(np.allclose(x, y, rtol=0, atol=1e-6) for x, y in zip(a, b, strict=True))


def model_bytes(arrays):
    return sum(len(t) for t in ndarrays_to_parameters(arrays).tensors)


def test_fed_star_runs_2p_steps_and_counts_peer_models(setup):
    records, snaps = [], []
    s, clients = build(setup, on_round=records.append, on_checkpoint=snaps.append)
    assert s.steps_per_round(1) == 4 and s.flower_rounds() == ROUNDS * 4
    assert run(s, clients, s.flower_rounds()) == [0, 0, 0, N] * ROUNDS
    assert [r["round"] for r in records] == [1, 2]
    one = model_bytes(s.global_arrays)
    for r in records:
        assert r["steps"] == 4 and r["fit_instructions"] == 2 * 2 * N
        assert r["bytes_down"] == 2 * N * one  # each client its own model, per period
        assert r["bytes_down_xeval"] == 2 * N * N * one  # all K models to each of K clients
        assert r["bytes_up_xeval"] == 0 and r["bytes_up"] == 2 * N * one
    assert [(c.round, c.step) for c in snaps][:4] == [(1, 0), (1, 1), (1, 2), (1, None)]
    def own(snap):  # the strategy's state (the base adds the round's start model)
        return sorted(k for k in snap.state if k != "round-start")

    assert own(snaps[0]) == ["peer-sizes"] + [f"peer-trained-{p}" for p in range(N)]
    assert own(snaps[1]) == [f"peer-local-{p}" for p in range(N)] + ["peer-sizes"]
    # after the round only the last pre-aggregates are left (each client's P model)
    assert own(snaps[3]) == [f"peer-personal-{p}" for p in range(N)]


def test_fed_star_pre_aggregates_by_one_minus_train_accuracy(setup):
    snaps = []
    s, clients = build(setup, on_checkpoint=snaps.append)
    run(s, clients, 3)  # period 1 (train, cross-evaluate), then period 2's training
    trained = [snaps[0].state[f"peer-trained-{p}"] for p in range(N)]
    local = {p: snaps[1].state[f"peer-local-{p}"] for p in range(N)}
    for k in range(N):
        m = np.array([1 - train_accuracy(setup, k, trained[j]) for j in range(N)])
        assert m.sum() > 0
        assert close(local[k], combine(trained, m / m.sum()))
    assert not close(local[0], local[1])  # personal pre-aggregates ...
    plan = s.current_plan  # ... each the start of that client's second period
    assert plan.step == 2 and all(plan.get(p).arrays is local_p
                                  for p, local_p in s.local.items())
    assert all(close(s.local[p], local[p]) for p in range(N))


def test_fed_star_exclude_self_gives_the_own_model_no_weight(setup):
    snaps = []
    s, clients = build(setup, settings=FedStarSettings(exclude_self=True, periods=1),
                       on_checkpoint=snaps.append)
    captured = {}
    end_period = s.end_period
    s.end_period = lambda plan, pre: (captured.update(pre), end_period(plan, pre))[1]
    run(s, clients, 2)
    trained = [snaps[0].state[f"peer-trained-{p}"] for p in range(N)]
    for k in range(N):
        m = np.array([0.0 if j == k else 1 - train_accuracy(setup, k, trained[j])
                      for j in range(N)])
        assert close(captured[k], combine(trained, m / m.sum()))


@pytest.mark.parametrize("mode", ["data-size", "uniform"])
def test_the_server_aggregates_the_last_pre_aggregates(setup, mode):
    _, fd = setup
    s, clients = build(setup, settings=FedStarSettings(periods=1, final_weights=mode))
    captured = {}
    end_period = s.end_period
    s.end_period = lambda plan, pre: (captured.update(pre), end_period(plan, pre))[1]
    run(s, clients, 2)
    sizes = np.array([len(fd.client(p).y_train) for p in range(N)], dtype=np.float64)
    weights = sizes / sizes.sum() if mode == "data-size" else np.full(N, 1 / N)
    assert close(s.global_arrays, combine([captured[p] for p in range(N)], weights))
    assert s.local == {} and s.sizes == {}


def test_ring_fed_mixes_each_trained_model_with_its_predecessor(setup):
    records, snaps = [], []
    s, clients = build(setup, RingFed, RingFedSettings(gamma=0.7, periods=2),
                       on_round=records.append, on_checkpoint=snaps.append)
    assert s.flower_rounds() == ROUNDS * 2
    assert run(s, clients, s.flower_rounds()) == [0, N] * ROUNDS
    ring = s.ring(list(range(N)))
    assert sorted(ring) == list(range(N)) and ring == s.ring(list(range(N)))
    first, fresh = build(setup, RingFed)  # the same first period, trained independently here
    start = first.global_arrays
    trained = {p: fresh[p].fit(start, {"server-round": 1})[0] for p in range(N)}
    for i, k in enumerate(ring):
        prev = ring[i - 1]
        assert close(snaps[0].state[f"peer-local-{k}"],
                     combine([trained[k], trained[prev]], [0.3, 0.7]))
    assert [r["steps"] for r in records] == [2, 2] and records[0]["bytes_down_xeval"] == 0
    assert records[0]["bytes_down"] == 2 * N * model_bytes(start)
    personal = [f"peer-personal-{p}" for p in range(N)]
    assert sorted(snaps[1].state) == personal and sorted(snaps[-1].state) == personal


@pytest.mark.parametrize("cls, mid", [(FedStar, (2, 0)), (FedStar, (2, 1)), (RingFed, (2, 0))])
def test_resume_in_the_middle_of_a_round_gives_the_same_arrays(setup, cls, mid):
    records, snaps = [], []
    s, clients = build(setup, cls, on_round=records.append, on_checkpoint=snaps.append)
    run(s, clients, s.flower_rounds())
    snap = next(c for c in snaps if (c.round, c.step) == mid)
    assert snap.state  # per-client models are in the checkpoint
    resumed = []
    r, r_clients = build(setup, cls, on_round=resumed.append)
    r.resume(snap)
    run(r, r_clients, r.flower_rounds())
    assert all(np.array_equal(a, b) for a, b in zip(r.global_arrays, s.global_arrays,
                                                    strict=True))
    (after,) = resumed
    for key in ("round", "global_accuracy", "fit_clients", "bytes_down", "bytes_up",
                "bytes_down_xeval", "steps", "fit_instructions", "client_global_accuracy"):
        assert after[key] == records[1][key], key


def test_fed_star_needs_a_classification_dataset():
    with pytest.raises(ConfigError, match="algorithm=.fedstar.: needs a classification"):
        validate(load_config("regression-quick", ["algorithm=fedstar"]), check_data=False)
    validate(load_config("regression-quick", ["algorithm=ringfed"]), check_data=False)


def test_exchange_trainable_leaves_frozen_arrays_home(setup):
    """Frozen features never travel: every message is the trainable part only (bytes by value),
    the frozen arrays stay as built, and the trainable result equals exchanging everything."""
    runs = {}
    for mode in ("trainable", "all"):
        records = []
        s, clients = build(setup, settings=FedStarSettings(periods=1, exchange=mode),
                           freeze=True, on_round=records.append)
        run(s, clients, 2)
        runs[mode] = s, records[0]
    s, rec = runs["trainable"]
    names = s.array_names
    init = get_arrays(frozen_model(setup[0]))
    trainable = [a for n, a in zip(names, init, strict=True) if n not in FROZEN]
    one, whole = model_bytes(trainable), model_bytes(init)
    assert 0 < one < whole and len(trainable) == len(init) - 2
    assert rec["bytes_down"] == N * one and rec["bytes_up"] == N * one
    assert rec["bytes_down_xeval"] == N * N * one
    assert rec["bytes_down_eval"] == N * 2 * one  # global + own pre-aggregate
    assert runs["all"][1]["bytes_down_xeval"] == N * N * whole
    for n, a, b, start in zip(names, s.global_arrays, runs["all"][0].global_arrays, init,
                              strict=True):
        if n in FROZEN:
            assert np.array_equal(a, start)
        else:
            assert np.array_equal(a, b), n
    assert rec["global_accuracy"] == runs["all"][1]["global_accuracy"]


def test_p_is_each_clients_last_pre_aggregate(setup):
    """personal: pre-aggregate: P of client k = its last pre-aggregate on its test split, G = the
    global model (both computed here directly); personal: global gives P = G."""
    import torch

    from clients.arrays import set_arrays

    cfg, fd = setup
    records, captured = [], {}
    s, clients = build(setup, settings=FedStarSettings(periods=1), on_round=records.append)
    end_period = s.end_period
    s.end_period = lambda plan, pre: (captured.update(pre), end_period(plan, pre))[1]
    run(s, clients, 2)

    def test_accuracy(pid, arrays):
        model = make_model(cfg)
        set_arrays(model, arrays)
        model.eval()
        data = fd.client(pid)
        with torch.no_grad():
            return int((model(data.x_test).argmax(1) == data.y_test).sum()) / len(data.y_test)

    rec = records[0]
    for k in range(N):
        assert rec["client_personal_accuracy"][k] == pytest.approx(
            test_accuracy(k, captured[k]), abs=1e-9)
        assert rec["client_global_accuracy"][k] == pytest.approx(
            test_accuracy(k, s.global_arrays), abs=1e-9)
    assert rec["client_personal_accuracy"] != rec["client_global_accuracy"]
    records = []
    g, clients = build(setup, settings=FedStarSettings(periods=1, personal="global"),
                       on_round=records.append)
    run(g, clients, 2)
    assert records[0]["client_personal_accuracy"] == records[0]["client_global_accuracy"]
    assert records[0]["client_global_accuracy"] == rec["client_global_accuracy"]
