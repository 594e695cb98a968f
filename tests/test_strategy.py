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
from tests.inprocess import ProxyManager

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
    """A node answering the handshake with `pid` (or raising `error`)."""

    def __init__(self, cid, pid, num_train=100, num_test=20, error=None):
        self.cid, self.pid, self.asked = cid, pid, 0
        self.num_train, self.num_test, self.error = num_train, num_test, error

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        if self.error:
            raise self.error
        return GetPropertiesRes(OK, {"partition-id": self.pid, "num-train": self.num_train,
                                     "num-test": self.num_test})


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
            {"partition-id": 1}), "1 arrays, expected"),  # counted before it is decoded
    (FitRes(OK, Parameters(tensors=[b"not an npy"] + ndarrays_to_parameters(
        client_arrays(0.0)).tensors[1:], tensor_type="numpy.ndarray"), 5,
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
    manager = ProxyManager(proxies)
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
    ins = s.configure_fit(1, ndarrays_to_parameters(INIT), ProxyManager(proxies))
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
    ins = s.configure_fit(1, None, ProxyManager([FakeProxy(f"n{i}", i) for i in range(6)]))
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
    assert s.configure_evaluate(1, None, ProxyManager([])) == []  # round 1 not due: no eval
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


# ---- what clients claim (issue 19): handshakes, updates, evaluations, population ----------
def test_bad_handshakes_are_ignored_and_a_duplicate_is_not_counted_twice():
    good = [FakeProxy(f"n{i}", i, num_train=50 + i, num_test=10 + i) for i in range(4)]
    bad = [FakeProxy("crash", 1, error=ValueError("Message contains an Error")),
           FakeProxy("outside", 9), FakeProxy("bool", True), FakeProxy("minus", -1),
           FakeProxy("no-sizes", 3, num_train="many"),
           FakeProxy("wrong-test", 3, num_train=53, num_test=99),  # partition 3 has 13
           FakeProxy("small-train", 0, num_train=10, num_test=10)]  # partition 0 has 50
    duplicate = FakeProxy("dup", 2, num_train=52, num_test=12)
    s = make_strategy(num_clients=4, partition_sizes=[(50 + i, 10 + i) for i in range(4)])
    manager = ProxyManager([*good, *bad, duplicate])
    clients = s.nodes.clients_by_partition(manager)  # old code: the ValueError stopped the run
    assert {pid: p.cid for pid, p in clients.items()} == {0: "n0", 1: "n1", 2: "n2", 3: "n3"}
    assert sorted(s.nodes.ignored) == sorted(p.cid for p in bad[1:])
    assert s.nodes.standby == {"dup": 2}
    for _ in range(3):
        s.nodes.clients_by_partition(manager)
    assert sorted(s.nodes.ignored) == sorted(p.cid for p in bad)
    assert bad[0].asked == 3  # a failed handshake is tried 3 times (it may be transient)
    assert all(p.asked == 1 for p in bad[1:]) and duplicate.asked == 1  # never asked again
    assert good[2].asked == 2  # asked once more when the duplicate claimed its partition
    del manager.proxies["n2"]  # the holder leaves: the duplicate takes over
    assert s.nodes.clients_by_partition(manager)[2].cid == "dup"
    good[3].error = TimeoutError("no reply")  # killed; its restart comes back with a new id
    manager.proxies["n3-restarted"] = FakeProxy("n3-restarted", 3, num_train=53, num_test=13)
    assert s.nodes.clients_by_partition(manager)[3].cid == "n3-restarted"


def sampled_step(s, proxies):
    """configure_fit on these nodes: the plan's partition ids and each one's proxy."""
    s.configure_fit(1, None, ProxyManager(proxies))
    by_pid = {p.pid: p for p in proxies}
    return [(pid, by_pid[pid]) for pid in s.current_plan.partition_ids]


def test_an_update_is_bound_to_the_node_the_server_sampled():
    s = make_strategy(min_fit_fraction=0.3)
    (a, pa), (b, pb), _ = sampled_step(s, [FakeProxy(f"n{i}", i) for i in range(6)])
    forged = fit_res(b, client_arrays(1e6), n=10)  # node a claims b's partition
    as_bool = FitRes(OK, ndarrays_to_parameters(client_arrays(1e6)), 10,
                     {"partition-id": True})
    assert "claims partition-id" in s.check_upload(forged, pa)
    assert "partition-id=True" in s.check_upload(as_bool, pa)
    assert "holds no partition" in s.check_upload(fit_res(a, client_arrays(1.0)),
                                                  FakeProxy("stranger", a))
    params, _ = s.aggregate_fit(1, [(pa, forged), (pa, as_bool),
                                    (pb, fit_res(b, client_arrays(2.0)))], [])
    np.testing.assert_array_equal(parameters_to_ndarrays(params)[0], 2.0)
    assert s.current.rejected == 2


def test_declared_counts_are_bounded_by_the_handshake():
    s = make_strategy(min_fit_fraction=0.3)
    (a, pa), (b, pb), _ = sampled_step(s, [FakeProxy(f"n{i}", i, num_train=100)
                                           for i in range(6)])
    huge = fit_res(b, client_arrays(1e6), n=10**12)
    assert s.check_upload(huge, pb) == \
        f"client {b}: num_examples=1000000000000 exceeds its 100 samples (handshake)"
    assert not isinstance(s.check_upload(fit_res(b, client_arrays(3.0), n=100), pb), str)
    params, _ = s.aggregate_fit(1, [(pa, fit_res(a, client_arrays(1.0), n=10)), (pb, huge)],
                                [])
    # without the bound: (10 * 1 + 1e12 * 1e6) / (10 + 1e12) ~ 1e6
    np.testing.assert_array_equal(parameters_to_ndarrays(params)[0], 1.0)


def test_max_update_norm_rejects_a_large_change():
    s = make_strategy(max_update_norm=5.0)
    (a, pa), _, _ = sampled_step(s, [FakeProxy(f"n{i}", i) for i in range(6)])
    # INIT is zeros over 4 + 3 = 7 entries: the change norm of value v is sqrt(7) v
    assert not isinstance(s.check_upload(fit_res(a, client_arrays(1.8)), pa), str)  # 4.76
    reason = s.check_upload(fit_res(a, client_arrays(2.0)), pa)  # 5.29
    assert reason == f"client {a}: update norm 5.292 exceeds federation.max-update-norm=5"
    unbounded = make_strategy()
    (a, pa), _, _ = sampled_step(unbounded, [FakeProxy(f"n{i}", i) for i in range(6)])
    assert not isinstance(unbounded.check_upload(fit_res(a, client_arrays(1e6)), pa), str)


@pytest.mark.parametrize("n, correct_g, reason", [
    (10, 1000, "correct-global=1000 must be an integer in 0..10"),
    (10, -3, "correct-global=-3 must be an integer in 0..10"),
    (10, 5.0, "correct-global=5.0 must be an integer in 0..10"),
    (10, True, "correct-global=True must be an integer in 0..10"),
    (11, 5, "evaluated 11 samples, its test split has 10"),
])
def test_impossible_evaluations_are_rejected(n, correct_g, reason):
    s = make_strategy(num_clients=2)
    proxies = [FakeProxy("n0", 0, num_test=10), FakeProxy("n1", 1, num_test=30)]
    s.nodes.clients_by_partition(ProxyManager(proxies))
    bad = EvaluateRes(OK, 1.0, n, {"correct-global": correct_g, "correct-personal": 5,
                                   "partition-id": 0})
    m = s.evaluation_metrics([bad, eval_res(30, 27, 30, pid=1)],
                             [s.nodes.facts_of(p) for p in proxies])
    assert m["eval_failure_reasons"] == [f"client 0: {reason}"]
    assert m["global_accuracy"] == 27 / 30  # old code: (1000 + 27) / 40 = 2567.5%
    assert m["eval_population"] == [1]


def test_impossible_regression_sums_are_rejected():
    from fedapps.tasks import TASKS

    reg = TASKS["regression"]
    ok = {"sum-y": 3.0, "sum-y2": 5.0, "sse-global": 1.0, "sse-personal": 0.5}
    assert reg.check_sums(2, ok) is None
    assert reg.check_sums(2, {**ok, "sse-global": -1.0}) == "sse-global=-1.0 must be >= 0"
    assert "impossible" in reg.check_sums(2, {**ok, "sum-y": 4.0})  # 16 > 2 * 5
    assert "finite" in reg.check_sums(2, {**ok, "sum-y2": float("nan")})


def test_each_round_records_its_evaluated_population():
    s = make_strategy(num_clients=3)
    records = []
    s.on_round = records.append
    proxies = [FakeProxy("n0", 0, num_test=10), FakeProxy("n2", 2, num_test=30)]  # 1 is down
    s.nodes.clients_by_partition(ProxyManager(proxies))
    s.open_step(1, 0, [0, 2])
    s.aggregate_fit(1, [(proxies[0], fit_res(0, client_arrays(1.0)))], [])
    ins = s.configure_evaluate(1, None, ProxyManager(proxies))
    assert [p.cid for p, _ in ins] == ["n0", "n2"]
    s.aggregate_evaluate(1, [(proxies[0], eval_res(10, 4, 5, pid=0)),
                             (proxies[1], eval_res(30, 30, 30, pid=2))], [])
    r = records[0]
    assert (r["eval_population"], r["eval_expected"], r["eval_missing"]) == ([0, 2], 3, [1])
    assert r["eval_complete"] is False and r["global_accuracy"] == 34 / 40


def test_best_and_final_g_come_from_complete_rounds():
    from fedapps.results import summarize

    rounds = [{"round": i + 1, "global_accuracy": g, "personal_accuracy": g, "bytes_down": 0,
               "bytes_up": 0, "failures": 0, "fit_clients": [0], "eval_complete": c}
              for i, (g, c) in enumerate([(0.40, True), (0.60, False), (0.50, True),
                                          (0.55, False)])]
    s = summarize(rounds)
    assert (s["best_global_accuracy"], s["final_global_accuracy"]) == (0.50, 0.50)
    assert s["final_round"] == 3 and s["partial_rounds"] == [2, 4]
    s = summarize(rounds, allow_partial=True)
    assert (s["best_global_accuracy"], s["final_global_accuracy"]) == (0.60, 0.55)
