"""Fed-Cyclic's relay chains (`algo.chains`): C = 1 is the thesis's single relay, C = K is
FedAvg, chains average by data size, and a mid-round resume keeps every chain's model."""

import numpy as np
import pytest

from clients.arrays import get_arrays
from clients.fedavg import FedAvgClient
from fedapps.config import ConfigError, load_config
from fedapps.runtime import make_model, train_settings
from fedapps.settings import build_settings
from fedapps.validation import validate
from strategies.fedavg import FedAvg
from strategies.fedcyclic import FedCyclic, FedCyclicSettings
from strategies.uploads import Upload
from tests.inprocess import digits_setup, run

K = 4


@pytest.fixture(scope="module")
def setup():
    return digits_setup(K)


def build(setup, cls=FedCyclic, per_round=K, algo=None, **kw):
    cfg, fd = setup
    model = make_model(cfg)
    extra = {} if cls is FedAvg else {"algo": algo if algo is not None else FedCyclicSettings()}
    strategy = cls(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                   num_rounds=2, num_clients=K, clients_per_round=per_round, seed=0,
                   **extra, **kw)
    clients = {pid: FedAvgClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid)
               for pid in range(K)}
    return strategy, clients


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_one_chain_is_the_single_relay_of_the_thesis(setup):
    """Without the key and with chains=1: the model of a hand-run relay, bit for bit."""
    plain, plain_clients = build(setup)
    run(plain, plain_clients, K)
    keyed, keyed_clients = build(setup, algo=build_settings(FedCyclicSettings, {"chains": 1}))
    run(keyed, keyed_clients, K)
    assert same(plain.global_arrays, keyed.global_arrays)
    # by hand: each client trains the previous client's model, in the seeded relay order
    _, clients = build(setup)
    model = get_arrays(make_model(setup[0]))
    for step, pid in enumerate(plain.relay_order(1, list(range(K)))):
        config = {"server-round": 1, **({"step": step} if step else {})}
        model, _, _ = clients[pid].fit(model, config)
    assert same(plain.global_arrays, model)


def test_one_client_per_chain_is_fedavg(setup):
    records_c, records_a = [], []
    cyc, cyc_clients = build(setup, algo=FedCyclicSettings(chains=K), on_round=records_c.append)
    avg, avg_clients = build(setup, FedAvg, on_round=records_a.append)
    assert cyc.steps_per_round(1) == 1
    run(cyc, cyc_clients, 2)
    run(avg, avg_clients, 2)
    assert same(cyc.global_arrays, avg.global_arrays)  # same updates, same aggregate
    for rc, ra in zip(records_c, records_a, strict=True):
        for key in ("global_accuracy", "loss", "fit_clients", "bytes_up", "bytes_down"):
            assert rc[key] == ra[key], key


def test_chains_split_the_relay_order_and_average_by_data_size(setup):
    s, _ = build(setup, per_round=3, algo=FedCyclicSettings(chains=2))
    assert s.steps_per_round(1) == 2  # ceil(3 / 2)
    order = s.relay_order(1, [0, 1, 2])
    groups = s.chain_groups(1, [0, 1, 2])
    assert sorted(groups, key=len, reverse=True) == [order[:2], order[2:]]  # contiguous
    first = s.plan(1, 0, [0, 1, 2])
    assert sorted(first.partition_ids) == sorted(g[0] for g in groups)
    # step 0: chain models 1.0 and 3.0; step 1: the longer chain's second hop gives 5.0
    shapes = [a.shape for a in s.global_arrays]

    def upload(pid, value, n):
        return Upload(pid, [np.full(sh, value, np.float32) for sh in shapes], n, {})

    long_c = next(c for c, g in enumerate(groups) if len(g) == 2)
    head = {c: g[0] for c, g in enumerate(groups)}
    ups = sorted([upload(head[long_c], 1.0, 10), upload(head[1 - long_c], 3.0, 30)],
                 key=lambda u: u.partition_id)
    mid = s.aggregate(first, ups)
    assert mid[0].flat[0] == pytest.approx((1.0 * 10 + 3.0 * 30) / 40)  # sizes so far
    s.global_arrays = mid
    second = s.plan(1, 1, [0, 1, 2])
    (hop,) = second.assignments
    assert hop.partition_id == groups[long_c][1]
    assert hop.arrays[0].flat[0] == 1.0  # the chain's own model, not the average
    assert second.last_step
    end = s.aggregate(second, [upload(hop.partition_id, 5.0, 20)])
    # long chain: model 5.0, size 10 + 20; short chain: 3.0, size 30
    assert end[0].flat[0] == pytest.approx((5.0 * 30 + 3.0 * 30) / 60)
    assert s.state_arrays() == {}  # chain state ends with the round


def test_resume_in_the_middle_of_a_round_keeps_every_chain(setup):
    records, snaps = [], []
    algo = FedCyclicSettings(chains=2)
    s, clients = build(setup, algo=algo, on_round=records.append, on_checkpoint=snaps.append)
    assert s.flower_rounds() == 4
    run(s, clients, 4)
    mid = snaps[2]
    assert (mid.round, mid.step) == (2, 0)
    assert {"chain0", "chain1", "chain-meta"} <= set(mid.state)
    assert not same(mid.state["chain0"], mid.state["chain1"])
    resumed = []
    r, r_clients = build(setup, algo=algo, on_round=resumed.append)
    r.resume(mid)
    run(r, r_clients, r.flower_rounds())
    assert same(r.global_arrays, s.global_arrays)
    (after,) = resumed
    for key in ("round", "global_accuracy", "personal_accuracy", "fit_clients", "bytes_down",
                "bytes_up", "steps", "client_global_accuracy"):
        assert after[key] == records[1][key], key


@pytest.mark.parametrize("overrides, message", [
    (["algo.chains=3"], "algo.chains=3: must be <= the clients per round (2)"),
    (["algo.chains=0"], "algo.chains=0: must be an integer >= 1"),
])
def test_chains_are_validated(overrides, message):
    cfg = load_config("quickstart", ["algorithm=fedcyclic", "federation.num-clients=4",
                                     "federation.clients-per-round=2", *overrides])
    with pytest.raises(ConfigError) as err:
        validate(cfg, check_data=False)
    assert message in str(err.value)


def test_relay_lean_splits_the_final_round_by_relay_position(tmp_path):
    """simulations/relay_lean.py: the final model's per-client scores averaged over the last
    clients of that round's relay order and over the rest (docs/RESULTS.md's lean)."""
    import json

    from simulations.relay_lean import lean, main
    from strategies.fedcyclic import relay_order

    scores = [0.1 * i for i in range(6)]
    (tmp_path / "config.yaml").write_text(
        "seed: 4\nfederation: {num-clients: 6}\nalgo: {order: reshuffle}\n")
    (tmp_path / "results.json").write_text(json.dumps({"rounds": [
        {"round": 7, "fit_clients": [0, 1, 2, 3, 4, 5], "client_global_accuracy": scores}]}))
    order = relay_order(4, 7, 6, True, list(range(6)))
    assert order != relay_order(4, 7, 6, False, list(range(6)))  # the draw depends on the order
    rank = np.argsort(np.random.default_rng([4, 7, 303]).permutation(6))  # the seeded draw
    assert order == sorted(range(6), key=lambda p: rank[p])
    end, rest = lean(tmp_path, 2)
    assert end == pytest.approx(100 * (scores[order[-1]] + scores[order[-2]]) / 2)
    assert rest == pytest.approx(100 * np.mean([scores[p] for p in order[:-2]]))
    fixed = relay_order(4, 7, 6, False, list(range(6)))
    assert lean(tmp_path, 2, "fixed")[0] == pytest.approx(
        100 * (scores[fixed[-1]] + scores[fixed[-2]]) / 2)
    assert main([str(tmp_path), "--last", "2"]) == 0
    with pytest.raises(SystemExit, match="leaves no other clients"):
        lean(tmp_path, 6)
    scores[order[-1]] = None  # not evaluated that round: left out, the relay order kept
    (tmp_path / "results.json").write_text(json.dumps({"rounds": [
        {"round": 7, "fit_clients": [0, 1, 2, 3, 4, 5], "client_global_accuracy": scores}]}))
    assert lean(tmp_path, 2)[0] == pytest.approx(100 * scores[order[-2]])
    (tmp_path / "config.yaml").write_text(
        "seed: 4\nfederation: {num-clients: 6}\nalgo: {order: fixed, chains: 2}\n")
    with pytest.raises(SystemExit, match="chains=2"):
        lean(tmp_path, 2)
    with pytest.raises(SystemExit, match="not a run directory"):
        lean(tmp_path / "nowhere", 2)
