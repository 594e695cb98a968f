"""An in-process stand-in for Flower's server loop (tests only): the same calls in the same
order as flwr's legacy Server.fit (configure_fit -> fit -> aggregate_fit -> evaluate ->
configure_evaluate -> evaluate -> aggregate_evaluate), on NumPyClients in this process, so
strategy logic (steps, plans, checkpoints, resume) is tested by value in seconds."""

from __future__ import annotations

from flwr.common import (
    Code,
    EvaluateRes,
    FitRes,
    GetPropertiesRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)

OK = Status(Code.OK, "")


def digits_setup(num_clients: int):
    """(cfg, federated data) of a small digits federation: quickstart, 1 local epoch, the
    digits CNN; what the in-process strategy tests run on."""
    from fedapps.config import load_config
    from fedapps.data import federated_data

    cfg = load_config("quickstart", [f"federation.num-clients={num_clients}",
                                     "train.local-epochs=1", "model.name=digits-cnn"])
    return cfg, federated_data(cfg)


def train_accuracy(setup, pid: int, arrays) -> float:
    """Accuracy of a model with `arrays` on client pid's train split, computed directly (the
    independent check of a client's cross-evaluation score)."""
    import torch

    from clients.arrays import set_arrays
    from fedapps.registry import make_model

    cfg, fd = setup
    model = make_model(cfg)
    set_arrays(model, arrays)
    model.eval()
    data = fd.client(pid)
    with torch.no_grad():
        correct = int((model(data.x_train).argmax(1) == data.y_train).sum())
    return correct / len(data.y_train)


class LocalProxy:
    def __init__(self, cid: str, client) -> None:
        self.cid, self.client = cid, client

    def get_properties(self, ins, timeout, group_id):
        return GetPropertiesRes(OK, self.client.get_properties({}))


class ProxyManager:
    """A Flower ClientManager stand-in over given proxies (anything with a `cid`)."""

    def __init__(self, proxies) -> None:
        self.proxies = {p.cid: p for p in proxies}

    def wait_for(self, num_clients, timeout):
        return True

    def all(self):
        return dict(self.proxies)


class LocalManager(ProxyManager):
    def __init__(self, clients: dict[int, object]) -> None:
        super().__init__(LocalProxy(f"node{pid}", c) for pid, c in clients.items())


def run(strategy, clients: dict[int, object], flower_rounds: int) -> list[int]:
    """Run `flower_rounds` server rounds; returns how many clients evaluated in each."""
    manager = LocalManager(clients)
    params = strategy.initialize_parameters(manager)
    evaluated = []
    for fr in range(1, flower_rounds + 1):
        results = []
        for proxy, ins in strategy.configure_fit(fr, params, manager):
            arrays, n, metrics = proxy.client.fit(parameters_to_ndarrays(ins.parameters),
                                                  ins.config)
            results.append((proxy, FitRes(OK, ndarrays_to_parameters(arrays), n, metrics)))
        new, _ = strategy.aggregate_fit(fr, results, [])
        params = new if new is not None else params
        strategy.evaluate(fr, params)
        eval_ins = strategy.configure_evaluate(fr, params, manager)
        answers = []
        for proxy, ins in eval_ins:
            loss, n, metrics = proxy.client.evaluate(parameters_to_ndarrays(ins.parameters),
                                                     ins.config)
            answers.append((proxy, EvaluateRes(OK, loss, n, metrics)))
        if eval_ins:
            strategy.aggregate_evaluate(fr, answers, [])
        evaluated.append(len(answers))
    return evaluated
