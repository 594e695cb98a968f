"""train.optimizer-state (issue 16 item 2) and eval.personal local-previous (item 4), in
process: persisted SGD momentum against a hand-run torch SGD, the client-state store (node
state and state-dir), a checkpoint/resume through Flower's call sequence (tests/inprocess.py),
and P of a client's previous local model against an accuracy computed here."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.common import Context, RecordDict
from omegaconf import OmegaConf
from torch.nn import functional as F

from clients.arrays import get_arrays, set_arrays
from clients.base import TrainSettings
from clients.fedavg import FedAvgClient
from fedapps.config import load_config
from fedapps.data import ClientData
from fedapps.errors import ConfigError
from fedapps.models import build_model
from fedapps.registry import ALGORITHMS, algo_settings, make_model
from fedapps.runtime import dataset_task, train_settings
from fedapps.validation import validate
from strategies.fedavg import FedAvg
from tests.inprocess import digits_setup, run

LR, MOMENTUM, EPOCHS = 0.05, 0.9, 2
SETTINGS = TrainSettings(EPOCHS, 30, LR, MOMENTUM, 0.0, 0)  # one full batch per epoch


def node() -> Context:
    """A node's context: Flower keeps its state between the messages to one node."""
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})


def toy_data() -> ClientData:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    return ClientData(x[:30], y[:30], x[30:], y[30:])


def toy_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("digits-cnn", (1, 8, 8), 10, 2)


def client(state: str, context: Context, state_dir=None) -> FedAvgClient:
    """A FedAvg client as Flower builds one per message (the context carries the state)."""
    return FedAvgClient(toy_model(), toy_data(), replace(SETTINGS, optimizer_state=state), 0,
                        context=context, state_dir=state_dir)


def two_participations(state: str, context_1: Context, context_2: Context,
                       state_dir=None) -> list[np.ndarray]:
    """Round 1 from the initial model, round 2 from another global model (the initial one
    scaled), so the round-2 parameters are replaced but the optimizer's state may carry on."""
    start = get_arrays(toy_model())
    client(state, context_1, state_dir).fit(start, {"server-round": 1})
    second = [a * 0.5 for a in start]
    arrays, _, _ = client(state, context_2, state_dir).fit(second, {"server-round": 2})
    return arrays


def hand_run(one_optimizer: bool) -> list[np.ndarray]:
    """The same two participations with torch.optim.SGD directly: one optimizer kept across
    both, or a fresh one each time. Full batches, so the shuffling does not matter."""
    model, data = toy_model(), toy_data()
    start = get_arrays(model)

    def sgd() -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    opt = sgd()
    for global_arrays in (start, [a * 0.5 for a in start]):
        set_arrays(model, global_arrays)  # copies into the same parameters
        opt = opt if one_optimizer else sgd()
        for _ in range(EPOCHS):
            opt.zero_grad()
            F.cross_entropy(model(data.x_train), data.y_train).backward()
            opt.step()
    return get_arrays(model)


def close(a, b) -> bool:
    return all(np.allclose(x, y, rtol=0, atol=1e-6) for x, y in zip(a, b, strict=True))


def test_persist_equals_one_optimizer_and_reset_equals_fresh_ones():
    kept, fresh = hand_run(one_optimizer=True), hand_run(one_optimizer=False)
    assert not close(kept, fresh)  # momentum carried over moves the second participation
    ctx = node()
    assert close(two_participations("persist", ctx, ctx), kept)
    ctx = node()
    assert close(two_participations("reset", ctx, ctx), fresh)
    assert not any(k.startswith("optimizer-") for k in ctx.state)  # reset keeps nothing


def test_optimizer_state_survives_a_restart_through_state_dir(tmp_path):
    ctx = node()
    in_memory = two_participations("persist", ctx, ctx)
    # a restarted node: empty context, the state comes back from state-dir (the SuperNode's
    # and `fedapps run`'s client-state path)
    restarted = node()
    from_disk = two_participations("persist", node(), restarted, state_dir=tmp_path)
    assert all(np.array_equal(a, b) for a, b in zip(in_memory, from_disk, strict=True))
    with np.load(tmp_path / "optimizer-model.npz", allow_pickle=False) as z:
        shapes = [z[f"arr_{i}"].shape for i in range(len(z.files) - 1)]
        written = z["written_at"].tolist()  # the (round, step) that wrote it
    assert shapes == [p.shape for p in toy_model().parameters()]
    assert written == [2, 0]
    assert "fedapps.restored-from-disk" in restarted.state


@pytest.mark.parametrize("algorithm, kept", [
    ("fedavg", {"model"}), ("fedprox", {"model"}), ("feddyn", {"model"}),
    ("ditto", {"personal", "model"}), ("fedper", {"model"}), ("fedrep", {"head", "base"}),
    ("fedbabu", {"base"}), ("fedrod", {"model"}), ("gpfl", {"model"}),
    ("fedreb", {"stage1", "stage2"})])
def test_every_optimizer_of_the_seed_000_001_algorithms_is_kept(algorithm, kept):
    """Each optimizer of the local training is named and stored (FedReb: opt_1 and opt_2,
    Ditto: the personal one too), with one buffer per parameter it steps."""
    cfg = load_config("quickstart", [f"algorithm={algorithm}", "federation.num-clients=4",
                                     "train.local-epochs=1", "train.optimizer-state=persist"])
    validate(cfg, check_data=False)
    from fedapps.data import federated_data

    spec = ALGORITHMS[algorithm]
    ctx = node()
    c = spec.client(spec.model(cfg), spec.client_data(cfg, federated_data(cfg), 0, "cpu"),
                    train_settings(cfg), 0, context=ctx, algo=algo_settings(cfg),
                    task=dataset_task(cfg), **spec.client_kwargs(cfg))
    c.fit(c.get_parameters({}), {"server-round": 1})
    stored = {k[len("optimizer-"):] for k in ctx.state if k.startswith("optimizer-")}
    assert stored == kept
    if algorithm == "fedreb":  # opt_1: base + H2, opt_2: base + H1, each a buffer per tensor
        n_base = len(list(c.model.base.parameters()))
        assert len(ctx.state["optimizer-stage1"].to_numpy_ndarrays()) == \
            n_base + len(list(c.personal.parameters()))
        assert len(ctx.state["optimizer-stage2"].to_numpy_ndarrays()) == \
            n_base + len(list(c.model.head.parameters()))


@pytest.mark.parametrize("key, value, algorithm, says", [
    ("train.optimizer-state", "keep", "fedavg", "allowed: reset, persist"),
    ("train.optimizer-state", "persist", "fedrolex", "fedrolex needs reset"),
    ("train.optimizer-state", "persist", "fednova", "fednova needs reset"),
    ("eval.personal", "previous", "fedavg", "allowed: algorithm, local-previous"),
    ("eval.personal", "local-previous", "fedper", "whose P is the global model")])
def test_bad_values_are_one_line_errors(key, value, algorithm, says):
    cfg = load_config("quickstart", [f"algorithm={algorithm}", f"{key}={value}"])
    with pytest.raises(ConfigError, match=says) as err:
        validate(cfg, check_data=False)
    assert "\n" not in str(err.value)


# ---- through Flower's call sequence: resume, and P of the previous local model -------------
N, ROUNDS = 3, 3


@pytest.fixture(scope="module")
def setup():
    return digits_setup(N)


def federation(setup, overrides, state_dirs=None, **kw):
    """FedAvg strategy and N clients (2 per round, so participations skip rounds)."""
    cfg, fd = setup
    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))  # a copy
    model = make_model(cfg)
    strategy = FedAvg(initial_arrays=get_arrays(model), array_names=list(model.state_dict()),
                      num_rounds=ROUNDS, num_clients=N, clients_per_round=2, seed=0, **kw)
    clients = {pid: FedAvgClient(make_model(cfg), fd.client(pid), train_settings(cfg), pid,
                                 context=node(),
                                 state_dir=state_dirs / f"p{pid}" if state_dirs else None)
               for pid in range(N)}
    return strategy, clients


def test_resume_with_persisted_momentum_repeats_the_uninterrupted_run(setup, tmp_path):
    persist = ["train.optimizer-state=persist"]
    full_records = []
    full, clients = federation(setup, persist, on_round=full_records.append)
    run(full, clients, full.flower_rounds())
    # stopped after round 2 (node state lost with the processes, state-dir kept), resumed
    snaps = []
    part, clients = federation(setup, persist, tmp_path, on_checkpoint=snaps.append)
    run(part, clients, 2)
    resumed_records = []
    again, clients = federation(setup, persist, tmp_path, on_round=resumed_records.append)
    again.resume(next(s for s in snaps if s.round == 2))
    run(again, clients, again.flower_rounds())
    assert all(np.array_equal(a, b) for a, b in zip(again.global_arrays, full.global_arrays,
                                                    strict=True))
    (last,) = resumed_records
    for key in ("global_accuracy", "personal_accuracy", "fit_clients", "loss"):
        assert last[key] == full_records[-1][key], key
    # the same resume without the clients' stored momentum (an empty state-dir) ends elsewhere:
    # round 3's clients both trained before, so what was kept is what made it equal
    lost, clients = federation(setup, persist, tmp_path / "lost")
    lost.resume(next(s for s in snaps if s.round == 2))
    run(lost, clients, lost.flower_rounds())
    assert not close(lost.global_arrays, full.global_arrays)


def test_local_previous_p_is_the_accuracy_of_the_last_locally_trained_model(setup):
    cfg, fd = setup
    records, uploads = [], {}
    strategy, clients = federation(setup, ["eval.personal=local-previous"],
                                   on_round=records.append)
    for pid, c in clients.items():  # note each client's upload (FedAvg: its trained model)
        def fit(parameters, config, c=c, pid=pid, fit=c.fit):
            arrays, n, metrics = fit(parameters, config)
            uploads.setdefault(pid, []).append((int(config["server-round"]), arrays))
            return arrays, n, metrics
        c.fit = fit
    run(strategy, clients, ROUNDS)

    def accuracy(pid, arrays):
        model = make_model(cfg)
        set_arrays(model, arrays)
        data = fd.client(pid)
        with torch.no_grad():
            return int((model.eval()(data.x_test).argmax(1) == data.y_test).sum()) / len(
                data.y_test)

    seen_untrained = seen_stale = False
    for rec in records:
        r = rec["round"]
        for pid in range(N):
            trained = [(rr, a) for rr, a in uploads.get(pid, []) if rr <= r]
            p = rec["client_personal_accuracy"][pid]
            if not trained:  # never trained yet: P is the global model's
                seen_untrained = True
                assert p == rec["client_global_accuracy"][pid]
            else:  # its last participation's model, also in rounds it sat out
                seen_stale |= trained[-1][0] < r
                assert p == accuracy(pid, trained[-1][1])
    assert seen_untrained and seen_stale  # 2 of 3 clients a round
