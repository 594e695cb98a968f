import numpy as np
import pytest
import torch

from clients.arrays import get_arrays
from clients.base import TrainSettings
from clients.fedavg import FedAvgClient
from fedapps.data import ClientData
from fedapps.models import build_model


def make_client(pid=0, seed=0, epochs=1):
    g = torch.Generator().manual_seed(123)
    x = torch.randn(40, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    data = ClientData(x[:30], y[:30], x[30:], y[30:])
    torch.manual_seed(0)
    model = build_model("digits-cnn", (1, 8, 8), 10, 2)
    return FedAvgClient(model, data, TrainSettings(epochs, 8, 0.05, 0.9, 0.0, seed), pid)


def test_fit_trains_and_reports_sample_count():
    client = make_client()
    start = get_arrays(client.model)
    arrays, n, metrics = client.fit(start, {"server-round": 1})
    assert n == 30 and metrics["partition-id"] == 0
    assert any(not np.array_equal(a, b) for a, b in zip(arrays, start, strict=True))


def test_fit_is_deterministic_for_seed_round_and_client():
    start = get_arrays(make_client().model)
    a, _, _ = make_client().fit(start, {"server-round": 2})
    b, _, _ = make_client().fit(start, {"server-round": 2})
    c, _, _ = make_client().fit(start, {"server-round": 3})
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_evaluate_counts_correct_predictions():
    client = make_client()
    arrays = get_arrays(client.model)
    loss, n, metrics = client.evaluate(arrays, {})
    with torch.no_grad():
        expected = int((client.model(client.data.x_test).argmax(1) == client.data.y_test).sum())
    assert n == 10
    assert metrics["correct-global"] == expected == metrics["correct-personal"]
    assert loss > 0


def test_state_survives_in_context_records():
    client = make_client()
    assert client.load_state("h2") is None
    client.save_state("h2", [np.arange(3.0)])
    np.testing.assert_array_equal(client.load_state("h2")[0], np.arange(3.0))


def test_state_dir_brings_state_back_after_a_restart(tmp_path):
    from flwr.common import Context, RecordDict

    def node():  # a fresh node process: empty in-memory state
        return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})

    first = make_client()
    first.__init__(first.model, first.data, first.settings, 0, context=node(), state_dir=tmp_path)
    first.save_state("head", [np.arange(4.0), np.ones((2, 2), np.float32)])
    assert (tmp_path / "head.npz").is_file() and not list(tmp_path.glob(".*tmp*"))
    again = make_client()
    again.__init__(again.model, again.data, again.settings, 0, context=node(), state_dir=tmp_path)
    assert not again.restored_from_disk
    arrays = again.load_state("head")
    assert again.restored_from_disk
    np.testing.assert_array_equal(arrays[0], np.arange(4.0))
    assert arrays[1].dtype == np.float32
    assert again.load_state("missing") is None


def test_multi_step_learning_rate():
    s = TrainSettings(1, 8, 0.1, 0.9, 0.0, 0, lr_milestones=(10, 20), lr_decay=0.1)
    assert [s.lr_at(r) for r in (1, 10, 11, 20, 21)] == pytest.approx([0.1, 0.1, 0.01, 0.01,
                                                                       0.001])
    client = make_client()
    client.settings = s
    client.seed_generator({"server-round": 15}, 0)
    opt = client.sgd(client.model.parameters())
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
