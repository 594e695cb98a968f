"""Round plans and client tasks: a cross-evaluation step (clients score several models sent
together through the server), its traffic in the round record, upload checks against the
plan, and the server optimizer applied after any algorithm's aggregation."""

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from clients.arrays import get_arrays
from clients.fedavg import FedAvgClient
from fedapps.runtime import make_model, train_settings
from strategies.aggregation import weighted_average
from strategies.base import BaseStrategy
from strategies.plan import Assignment, cross_evaluation
from strategies.server_opt import ServerOptimizer
from strategies.uploads import Upload, check_upload
from tests.inprocess import digits_setup, run, train_accuracy

OK = Status(Code.OK, "")
N = 3


class TrainThenScore(BaseStrategy):
    """Step 0: FedAvg. Step 1: every participant scores [new global, initial model]."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.initial = list(self.global_arrays)
        self.scores: dict[int, list[float]] = {}

    def steps_per_round(self, server_round):
        return 2

    def plan(self, server_round, step, participants):
        if step == 0:
            return super().plan(server_round, step, participants)
        return self.make_plan(server_round, step, [
            cross_evaluation(pid, [self.global_arrays, self.initial]) for pid in participants])

    def aggregate(self, plan, uploads):
        if plan.step == 0:
            return super().aggregate(plan, uploads)
        self.scores = {u.partition_id: u.scores(2) for u in uploads}
        return self.global_arrays


@pytest.fixture(scope="module")
def setup():
    return digits_setup(N)


def clients_for(setup):
    cfg, fd = setup
    return {pid: FedAvgClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid)
            for pid in range(N)}


def strategy(setup, cls=BaseStrategy, **kw):
    cfg, _ = setup
    model = make_model(cfg)
    return cls(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
               num_rounds=1, num_clients=N, clients_per_round=N, seed=0, **kw)


def test_cross_evaluation_scores_every_model_on_the_clients_train_split(setup):
    records = []
    s = strategy(setup, TrainThenScore, on_round=records.append)
    assert run(s, clients_for(setup), s.flower_rounds()) == [0, N]
    for pid, (new, old) in s.scores.items():
        assert new == pytest.approx(train_accuracy(setup, pid, s.global_arrays), abs=1e-12)
        assert old == pytest.approx(train_accuracy(setup, pid, s.initial), abs=1e-12)
    assert sorted(s.scores) == list(range(N))
    rec = records[0]
    one_model = sum(len(t) for t in ndarrays_to_parameters(s.initial).tensors)
    assert rec["bytes_down"] == N * one_model  # training step
    assert rec["bytes_down_xeval"] == N * 2 * one_model  # two models to each client
    assert rec["bytes_up_xeval"] == 0 and rec["bytes_up"] == N * one_model
    assert rec["fit_instructions"] == 2 * N and rec["steps"] == 2


def plan_with(assignment):
    from strategies.plan import RoundPlan

    return RoundPlan(1, 0, True, [assignment])


def test_cross_evaluation_answers_are_checked_against_the_plan():
    a = cross_evaluation(4, [[np.zeros(2)], [np.ones(2)]])
    assert a.arrays[1][0] == 1.0 and a.config == {"num-models": 2, "split": "train"}
    plan = plan_with(a)
    good = FitRes(OK, ndarrays_to_parameters([]), 7, {"partition-id": 4, "score-0": 0.5,
                                                      "score-1": 0.25})
    assert isinstance(check_upload(good, plan), Upload)
    assert check_upload(good, plan).scores(2) == [0.5, 0.25]
    missing = FitRes(OK, ndarrays_to_parameters([]), 7, {"partition-id": 4, "score-0": 0.5})
    assert "score-1=None" in check_upload(missing, plan)
    nan = FitRes(OK, ndarrays_to_parameters([]), 7, {"partition-id": 4, "score-0": float("nan"),
                                                     "score-1": 0.1})
    assert "score-0" in check_upload(nan, plan)
    with_arrays = FitRes(OK, ndarrays_to_parameters([np.zeros(2)]), 7,
                         {"partition-id": 4, "score-0": 0.5, "score-1": 0.2})
    assert "1 arrays, expected 0" in check_upload(with_arrays, plan)
    stranger = FitRes(OK, ndarrays_to_parameters([]), 7, {"partition-id": 5})
    assert "not part of round 1" in check_upload(stranger, plan)
    with pytest.raises(ValueError, match="task"):
        Assignment(0, [], [], task="dance")


def test_server_optimizer_steps_the_rounds_aggregate(setup):
    opt = ServerOptimizer("adam", lr=0.1)
    reference = ServerOptimizer("adam", lr=0.1)
    s = strategy(setup, server_optimizer=opt, on_round=lambda r: None)
    start = list(s.global_arrays)
    clients = clients_for(setup)
    uploads = {pid: c.fit(start, {"server-round": 1}) for pid, c in clients_for(setup).items()}
    run(s, clients, 1)
    fedavg = weighted_average([uploads[p][0] for p in range(N)], [uploads[p][1]
                                                                 for p in range(N)])
    expected = reference.step(start, fedavg, 1)
    assert all(np.array_equal(a, b) for a, b in zip(s.global_arrays, expected, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(fedavg, expected, strict=True))
    snap = s.snapshot(1, None)
    assert "server_opt_m" in snap.state  # the optimizer's state goes into the checkpoint
