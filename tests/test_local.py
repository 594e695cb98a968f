"""Local-model baseline (`algorithm: local`): every client trains only its own model, kept in
the node state; nothing travels for training and the global model is never trained."""

import numpy as np
import pytest
from flwr.common import Context, RecordDict

from clients.arrays import get_arrays
from clients.local import LocalClient
from fedapps.evaluation import evaluate_sums
from fedapps.runtime import make_model, train_settings
from fedapps.tasks import TASKS
from strategies.local import Local
from tests.inprocess import digits_setup, run

K = 3


@pytest.fixture(scope="module")
def setup():
    return digits_setup(K)


def context() -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def client(setup, pid, ctx=None, state_dir=None):
    cfg, fd = setup
    return LocalClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid,
                       context=ctx or context(), state_dir=state_dir)


def accuracy(model, data) -> float:
    model.eval()
    n, _, sums = evaluate_sums(lambda x: (model(x), model(x)), data.x_test, data.y_test,
                               TASKS["classification"])
    return sums["correct-global"] / n


def test_clients_train_alone_and_the_global_model_stays_initial(setup):
    cfg, fd = setup
    records = []
    model = make_model(cfg)
    s = Local(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
              num_rounds=2, num_clients=K, clients_per_round=1, seed=0, on_round=records.append)
    clients = {pid: client(setup, pid) for pid in range(K)}
    run(s, clients, 2)
    assert all(np.array_equal(a, b) for a, b in zip(s.global_arrays, get_arrays(model),
                                                    strict=True))
    for r in records:  # every client, every round, and no arrays either way
        assert r["fit_clients"] == list(range(K)) and r["bytes_down"] == 0 == r["bytes_up"]
    # by hand: each client's own model after two rounds of its own training
    for pid in range(K):
        alone = client(setup, pid)
        for rnd in (1, 2):
            alone.fit([], {"server-round": rnd})
        assert records[1]["client_personal_accuracy"][pid] == accuracy(alone.local,
                                                                        fd.client(pid))
        # G is the never-trained initial model on the same split
        assert records[1]["client_global_accuracy"][pid] == accuracy(make_model(cfg),
                                                                      fd.client(pid))
    assert records[1]["personal_accuracy"] > records[1]["global_accuracy"] + 0.2


def test_the_local_model_survives_a_new_client_object_and_a_restarted_node(setup, tmp_path):
    ctx = context()
    first = client(setup, 0, ctx, tmp_path)
    first.fit([], {"server-round": 1})
    trained = get_arrays(first.local)
    again = client(setup, 0, ctx)  # Flower builds a client per message: node state
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(again.local), trained,
                                                    strict=True))
    restarted = client(setup, 0, context(), tmp_path)  # empty node state: from state-dir
    assert restarted.restored_from_disk
    assert all(np.array_equal(a, b) for a, b in zip(get_arrays(restarted.local), trained,
                                                    strict=True))
    assert first.upload() == []
