"""Flower ServerApp: builds the configured strategy around a results writer."""

from __future__ import annotations

import time
from logging import INFO

from flwr.common import Context, log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from clients.arrays import get_arrays
from fedapps import checkpoint
from fedapps.config import ConfigError, clients_per_round, data_root, to_container
from fedapps.data import check_available, federated_data
from fedapps.registry import ALGORITHMS
from fedapps.results import ResultsWriter
from fedapps.runtime import (
    algo_params,
    config_from_run,
    run_dir,
    seed_everything,
    select_device,
)


def default_run_name(cfg) -> str:
    return f"{cfg.experiment}-{cfg.algorithm}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


def official_test_eval(cfg, data):
    """Accuracy and loss of the full global model on the dataset's official test split."""
    import torch
    from torch.nn import functional as F

    from clients.arrays import set_arrays

    device = select_device(cfg)  # the server's model is the largest: use the GPU when there
    x, y = (t.to(device) for t in data.official_test())
    model = ALGORITHMS[cfg.algorithm].model(cfg).to(device)

    def evaluate(arrays: list) -> dict[str, float]:
        set_arrays(model, arrays)
        model.eval()
        correct = torch.zeros((), dtype=torch.long, device=device)
        loss = torch.zeros((), dtype=torch.float64, device=device)
        with torch.no_grad():
            for start in range(0, len(y), 1024):
                logits = model(x[start:start + 1024])
                loss += F.cross_entropy(logits, y[start:start + 1024], reduction="sum").double()
                correct += (logits.argmax(1) == y[start:start + 1024]).sum()
        return {"official_test_accuracy": int(correct) / max(len(y), 1),
                "official_test_loss": float(loss) / max(len(y), 1)}

    return evaluate


def server_fn(context: Context) -> ServerAppComponents:
    cfg = config_from_run(context.run_config)
    if not cfg.output["run-name"]:
        cfg.output["run-name"] = default_run_name(cfg)
    seed_everything(int(cfg.seed))
    check_available(cfg.dataset, data_root(cfg), bool(cfg.data.download))
    data = federated_data(cfg)
    model = ALGORITHMS[cfg.algorithm].model(cfg)
    out = run_dir(cfg)
    saved = checkpoint.load(out) if cfg.output.resume else None
    if cfg.output.resume and saved is None:
        raise ConfigError(f"output.resume=true: no {checkpoint.FILE} in {out}")
    invocation = {"experiment": str(context.run_config.get("experiment", cfg.experiment)),
                  "overrides": str(context.run_config.get("overrides", ""))}
    writer = ResultsWriter(out, to_container(cfg), data.summary(), int(cfg.rounds),
                           invocation=invocation, resume_after=saved[0] if saved else None)
    fed = cfg.federation
    log(INFO, "[fedapps] %s: %s on %s, %d clients (%d per round), %d rounds, EMD %.3f -> %s",
        cfg.experiment, cfg.algorithm, cfg.dataset, fed["num-clients"], clients_per_round(cfg),
        cfg.rounds, data.summary()["emd"], out)
    spec = ALGORITHMS[cfg.algorithm]
    strategy = spec.strategy(
        initial_arrays=get_arrays(model),
        array_names=list(model.state_dict()),
        num_rounds=int(cfg.rounds),
        num_clients=int(fed["num-clients"]),
        clients_per_round=clients_per_round(cfg),
        seed=int(cfg.seed),
        min_fit_fraction=float(fed["min-fit-fraction"]),
        eval_every=int(cfg.eval["eval-every"]),
        eval_fraction=float(cfg.eval.fraction),
        algo=algo_params(cfg),
        central_eval=official_test_eval(cfg, data) if spec.official_test else None,
        on_too_few=str(fed["on-too-few"]),
        on_stop=writer.stop,
        **spec.strategy_kwargs(cfg, model),
    )

    def on_round(record: dict) -> None:
        writer.on_round(record)  # results first: a crash in between repeats this round
        checkpoint.save(out, record["round"], strategy.global_arrays, strategy.state_arrays())

    strategy.on_round = on_round
    done = 0
    if saved is not None:
        done = saved[0]
        strategy.resume_from(done, saved[1], saved[2])
        log(INFO, "[fedapps] resuming %s after round %d", out, done)
    if done >= int(cfg.rounds):
        raise ConfigError(f"rounds={cfg.rounds}: the run already completed {done} rounds")
    timeout = fed["round-timeout"]
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=int(cfg.rounds) - done,
                            round_timeout=float(timeout) if timeout else None))


app = ServerApp(server_fn=server_fn)
