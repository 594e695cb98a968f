import numpy as np
import pytest
from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    GetPropertiesRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

from strategies.fedavg import FedAvg

OK = Status(Code.OK, "")
INIT = [np.zeros((2, 2), dtype=np.float32), np.zeros(3, dtype=np.float32)]


def make_strategy(**kw) -> FedAvg:
    args = dict(initial_arrays=INIT, num_rounds=3, num_clients=6, clients_per_round=3, seed=7)
    args.update(kw)
    return FedAvg(**args)


def fit_res(pid, arrays, n=10, **metrics):
    return FitRes(OK, ndarrays_to_parameters(arrays), n, {"partition-id": pid, **metrics})


def client_arrays(value):
    return [np.full((2, 2), value, dtype=np.float32), np.full(3, value, dtype=np.float32)]


class FakeProxy:
    def __init__(self, cid, pid):
        self.cid, self.pid, self.asked = cid, pid, 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        return GetPropertiesRes(OK, {"partition-id": self.pid})


class FakeManager:
    def __init__(self, proxies):
        self.proxies = {p.cid: p for p in proxies}

    def wait_for(self, num_clients, timeout):
        return True

    def all(self):
        return dict(self.proxies)


def test_aggregate_fit_is_sample_weighted_fedavg():
    s = make_strategy()
    s.open_step(1, 0, [0, 1])
    results = [(None, fit_res(0, client_arrays(1.0), n=10)),
               (None, fit_res(1, client_arrays(4.0), n=30))]
    params, _ = s.aggregate_fit(1, results, [])
    out = parameters_to_ndarrays(params)
    # (10 * 1 + 30 * 4) / 40 = 3.25
    np.testing.assert_allclose(out[0], np.full((2, 2), 3.25))
    np.testing.assert_allclose(out[1], np.full(3, 3.25))


def test_aggregation_does_not_depend_on_arrival_order():
    rng = np.random.default_rng(0)
    res = [fit_res(i, [rng.normal(size=(2, 2)).astype(np.float32),
                       rng.normal(size=3).astype(np.float32)], n=i + 5) for i in range(4)]
    def run(results):
        s = make_strategy(clients_per_round=4)
        s.open_step(1, 0, range(4))
        return parameters_to_ndarrays(s.aggregate_fit(1, results, [])[0])

    a = run([(None, r) for r in res])
    b = run([(None, r) for r in res[::-1]])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("bad, reason", [
    (fit_res(1, [np.zeros((3, 2), np.float32), np.zeros(3, np.float32)]), "expected"),
    (fit_res(1, [np.zeros((2, 2), np.float64), np.zeros(3, np.float32)]), "expected"),
    (fit_res(1, [np.zeros((2, 2), np.float32)]), "1 arrays, expected 2"),
    (fit_res(1, [np.full((2, 2), np.nan, np.float32), np.zeros(3, np.float32)]), "NaN"),
    (fit_res(1, [np.zeros((2, 2), np.float32), np.full(3, np.inf, np.float32)]), "NaN or Inf"),
    (fit_res(1, client_arrays(0.0), n=0), "num_examples"),
    (fit_res(1, client_arrays(0.0), n=-3), "num_examples"),
    (FitRes(OK, Parameters(tensors=[b"not an npy"], tensor_type="numpy.ndarray"), 5,
            {"partition-id": 1}), "undecodable"),
    (FitRes(OK, ndarrays_to_parameters(client_arrays(0.0)), 5, {}), "partition-id"),
])
def test_bad_updates_are_rejected_and_counted(bad, reason):
    s = make_strategy()
    records = []
    s.on_round = records.append
    s.open_step(1, 0, [0, 1])
    checked = s.check_upload(bad)
    assert isinstance(checked, str) and reason in checked
    good = fit_res(0, client_arrays(2.0), n=10)
    params, _ = s.aggregate_fit(1, [(None, good), (None, bad)], [RuntimeError("boom")])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], 2.0)  # only the good one
    s.finish_round(1, {})
    assert records[0]["rejected_updates"] == 1
    assert records[0]["failures"] == 2  # one rejected + one crashed client


def test_too_few_valid_updates_skip_keeps_the_model():
    s = make_strategy(min_fit_fraction=1.0, on_too_few="skip")
    s.open_step(1, 0, [1])
    bad = fit_res(1, client_arrays(np.nan))
    params, _ = s.aggregate_fit(1, [(None, bad)], [])
    assert params is None
    np.testing.assert_array_equal(s.global_arrays[0], INIT[0])


def test_too_few_valid_updates_stop_the_run_with_a_reason():
    from strategies.base import TooFewClients

    reasons = []
    s = make_strategy(min_fit_fraction=0.5, on_stop=reasons.append, clients_per_round=4)
    plan = s.open_step(3, 0, range(6))
    first = plan.partition_ids[0]
    with pytest.raises(TooFewClients, match="fedapps resume"):
        s.aggregate_fit(3, [(None, fit_res(first, client_arrays(1.0)))],
                        [RuntimeError("x")] * 3)
    assert reasons == ["round 3: 1 valid updates of 4 sampled clients, 2 needed "
                       "(federation.min-fit-fraction)"]


def test_clients_by_partition_asks_each_node_once_and_samples_by_seed():
    proxies = [FakeProxy(f"node{i}", pid) for i, pid in enumerate([5, 3, 0, 1, 4, 2])]
    s = make_strategy()
    manager = FakeManager(proxies)
    first = s.nodes.clients_by_partition(manager)
    assert sorted(first) == list(range(6))
    assert first[5].cid == "node0"
    s.nodes.clients_by_partition(manager)
    assert all(p.asked == 1 for p in proxies)
    chosen = s.sample(2, list(first))
    assert chosen == make_strategy().sample(2, list(range(6)))  # independent of node order
    assert len(chosen) == 3 and len(set(chosen)) == 3
    other_seed = make_strategy(seed=8)
    assert any(other_seed.sample(r, range(6)) != s.sample(r, range(6)) for r in range(1, 6))


def test_configure_fit_sends_round_and_counts_bytes():
    proxies = [FakeProxy(f"n{i}", i) for i in range(6)]
    s = make_strategy()
    ins = s.configure_fit(1, ndarrays_to_parameters(INIT), FakeManager(proxies))
    assert len(ins) == 3
    assert all(fi.config["server-round"] == 1 for _, fi in ins)
    assert len({id(fi.parameters) for _, fi in ins}) == 1  # one message body, shared


def test_arrays_shared_by_several_clients_are_serialized_once(monkeypatch):
    import strategies.base as base

    calls = []
    real = base.ndarrays_to_parameters
    monkeypatch.setattr(base, "ndarrays_to_parameters",
                        lambda arrays: calls.append(1) or real(arrays))
    s = make_strategy()
    ins = s.configure_fit(1, None, FakeManager([FakeProxy(f"n{i}", i) for i in range(6)]))
    assert len(ins) == 3 and len(calls) == 1
    one = sum(len(t) for t in ndarrays_to_parameters(INIT).tensors)
    assert s.current.bytes_down == 3 * one


def eval_res(n, correct_g, correct_p, loss=1.0, pid=0):
    return EvaluateRes(OK, loss, n, {"correct-global": correct_g, "correct-personal": correct_p,
                                     "partition-id": pid})


def test_g_and_p_are_micro_averages():
    res = [eval_res(10, 5, 9, loss=1.0, pid=2), eval_res(30, 27, 30, loss=2.0, pid=0),
           eval_res(0, 0, 0, pid=1)]
    m = make_strategy(num_clients=4).evaluation_metrics(res)
    assert m["global_accuracy"] == pytest.approx(32 / 40)  # not mean(0.5, 0.9) = 0.7
    assert m["personal_accuracy"] == pytest.approx(39 / 40)
    assert m["loss"] == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    # per-client: global [0.5, 0.9], personal [0.9, 1.0]; the empty client is left out
    assert m["global_client_p50"] == pytest.approx(0.7)
    assert m["global_client_std"] == pytest.approx(0.2)
    assert m["personal_client_p10"] == pytest.approx(0.91)
    assert m["client_global_accuracy"] == [0.9, None, 0.5, None]  # by partition id
    assert m["client_personal_accuracy"] == [1.0, None, 0.9, None]


def test_round_record_has_the_contract_keys():
    s = make_strategy(eval_every=2)
    records = []
    s.on_round = records.append
    assert s.configure_evaluate(1, None, FakeManager([])) == []  # round 1 not due: no eval
    rec = records[0]
    for key in ("round", "global_accuracy", "personal_accuracy", "bytes_down", "bytes_up",
                "seconds", "fit_clients", "failures"):
        assert key in rec
    assert rec["global_accuracy"] is None
    assert s.eval_due(2) and s.eval_due(3) and not s.eval_due(1)  # last round always


def test_eval_fraction_samples_a_seeded_subset():
    s = make_strategy(num_clients=10, eval_fraction=0.3)
    a = s.eval_sample(4, range(10))
    assert len(a) == 3 and a == make_strategy(num_clients=10, eval_fraction=0.3).eval_sample(
        4, range(10))
    assert make_strategy(num_clients=10).eval_sample(4, range(10)) == list(range(10))


def test_round_time_is_split_into_fit_and_eval():
    s = make_strategy()
    records = []
    s.on_round = records.append
    s.open_step(1, 0, [0])
    s.aggregate_fit(1, [(None, fit_res(0, client_arrays(1.0)))], [])
    s.finish_round(1, {})
    r = records[0]
    assert r["fit_seconds"] >= 0 and r["eval_seconds"] >= 0
    assert r["fit_seconds"] + r["eval_seconds"] == pytest.approx(r["seconds"])
