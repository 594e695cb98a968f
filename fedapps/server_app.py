"""Flower ServerApp: builds the configured strategy around a results writer."""

from __future__ import annotations

import shlex
import time
from logging import INFO

from flwr.common import Context, log
from flwr.server import Server, ServerApp, ServerAppComponents, ServerConfig, SimpleClientManager

from clients.arrays import get_arrays, set_arrays
from fedapps import checkpoint, rundir
from fedapps.allocator import keep_freed_memory
from fedapps.config import clients_per_round, parse_overrides, squash_overrides, to_container
from fedapps.data import check_available, clients_hold_test, federated_data, params_text
from fedapps.errors import ConfigError
from fedapps.evaluation import evaluate_sums, summarize_central
from fedapps.paths import data_root
from fedapps.registry import ALGORITHMS, algo_settings
from fedapps.results import ResultsWriter
from fedapps.runtime import (
    config_from_run,
    dataset_task,
    run_dir,
    seed_everything,
    select_device,
)
from strategies.base import BaseStrategy
from strategies.server_opt import ServerOptimizer, from_settings


def default_run_name(cfg) -> str:
    return f"{cfg.experiment}-{cfg.algorithm}-s{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}"


# The server's official-test batch: its numbers were recorded at 1024 (static BatchNorm models
# normalise with the batch's statistics, so the batch size is part of the metric).
OFFICIAL_TEST_BATCH = 1024


def official_test_eval(cfg, data):
    """The task's metric and loss of the full global model on the official test split, with
    the evaluation loop the clients use."""
    device = select_device(cfg)  # the server's model is the largest: use the GPU when there
    # raw inputs, normalized a batch at a time (the same values as normalizing them all first)
    x, y = (t.to(device) for t in data.official_test_raw())
    model = ALGORITHMS[cfg.algorithm].model(cfg).to(device)
    task = dataset_task(cfg)

    def predict(xb):
        out = model(data.normalize(xb))
        return out, out

    def evaluate(arrays: list) -> dict[str, float]:
        set_arrays(model, arrays)
        model.eval()
        n, loss_sum, sums = evaluate_sums(predict, x, y, task, OFFICIAL_TEST_BATCH)
        return summarize_central(task, n, loss_sum, sums)

    return evaluate


def official_test_wanted(cfg) -> bool:
    """eval.official-test, or (null) the algorithm's own choice (model-heterogeneous methods
    evaluate the full global model there)."""
    forced = cfg.eval.get("official-test")
    return ALGORITHMS[cfg.algorithm].official_test if forced is None else bool(forced)


def server_optimizer(cfg, model) -> ServerOptimizer | None:
    """The configured server optimizer, or None for plain averaging (server.optimizer=none).
    Its parameter mask marks which of the model's state entries are parameters (the rest are
    buffers, which `server.step-buffers: false` leaves at the aggregate)."""
    params = {name for name, _ in model.named_parameters()}
    mask = [name in params for name in model.state_dict()]
    opt = from_settings(cfg.server, parameter_mask=mask)
    return None if opt.is_identity else opt


def server_fn(context: Context) -> ServerAppComponents:
    cfg = config_from_run(context.run_config)
    if not cfg.output["run-name"]:
        cfg.output["run-name"] = default_run_name(cfg)
    seed_everything(int(cfg.seed))
    keep_freed_memory()  # the central evaluation's batches reuse freed heap
    check_available(cfg.dataset, data_root(cfg), bool(cfg.data.download))
    data = federated_data(cfg)
    model = ALGORITHMS[cfg.algorithm].model(cfg)
    out = run_dir(cfg)
    run_id = context.run_config.get("run-id")  # set by the launcher that claimed `out`
    run_id = rundir.check_run_id(str(run_id)) if run_id else None
    rundir.check_owner(out, run_id)
    saved = checkpoint.load(out) if cfg.output.resume else None
    if cfg.output.resume and saved is None:
        raise ConfigError(f"output.resume=true: no {checkpoint.FILE} in {out}")
    if saved is not None and saved.completed_rounds >= int(cfg.rounds):  # before any write
        raise ConfigError(f"rounds={cfg.rounds}: the run already completed "
                          f"{saved.completed_rounds} rounds")
    overrides = squash_overrides(parse_overrides(str(context.run_config.get("overrides", ""))))
    invocation = {"experiment": str(context.run_config.get("experiment", cfg.experiment)),
                  "overrides": shlex.join(overrides)}
    partition = data.summary()
    writer = ResultsWriter(out, to_container(cfg), partition, int(cfg.rounds),
                           invocation=invocation, run_id=run_id,
                           resume_after=saved.completed_rounds if saved else None,
                           metric=dataset_task(cfg).metric)
    fed = cfg.federation
    emd = partition["emd"]
    log(INFO, "[fedapps] %s: %s on %s, %d clients (%d per round), %d rounds, %s (%s), EMD %s "
        "-> %s", cfg.experiment, cfg.algorithm, cfg.dataset, fed["num-clients"],
        clients_per_round(cfg), cfg.rounds, partition["partitioner"],
        params_text(partition["params"]), "-" if emd is None else f"{emd:.3f}", out)
    spec = ALGORITHMS[cfg.algorithm]
    timeout = float(fed["round-timeout"]) if fed["round-timeout"] else None
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
        algo=algo_settings(cfg),
        central_eval=official_test_eval(cfg, data) if official_test_wanted(cfg) else None,
        client_eval=clients_hold_test(cfg),
        on_too_few=str(fed["on-too-few"]),
        on_stop=writer.stop,
        task=dataset_task(cfg),
        server_optimizer=server_optimizer(cfg, model),
        round_timeout=timeout,
        partition_sizes=list(zip(partition["train_sizes"], partition["test_sizes"],
                                 strict=True)),
        max_update_norm=None if fed["max-update-norm"] is None
        else float(fed["max-update-norm"]),
        **spec.strategy_kwargs(cfg, model),
    )

    strategy.on_round = writer.on_round  # results first: a crash in between repeats a round
    strategy.on_checkpoint = lambda snap: checkpoint.save(out, snap, run_id)
    if saved is not None:
        strategy.resume(saved)
        where = (f"round {saved.round}" if saved.step is None
                 else f"step {saved.step + 1} of round {saved.round}")
        log(INFO, "[fedapps] resuming %s after %s", out, where)
    if strategy.flower_rounds() <= 0:
        raise ConfigError(f"rounds={cfg.rounds}: the run already completed "
                          f"{saved.completed_rounds if saved else 0} rounds")
    return ServerAppComponents(
        server=flower_server(strategy, int(fed["num-clients"])),
        config=ServerConfig(num_rounds=strategy.flower_rounds(), round_timeout=timeout))


MAX_MESSAGES_IN_FLIGHT = 64


def flower_server(strategy: BaseStrategy, num_clients: int) -> Server:
    """Flower's Server, which in a deployment gets a thread for every message of a step (at
    most 64): each thread waits for its client's answer, and Flower's default pool of cores + 4
    threads (6 on a 2-core server) sent a deployed step of more clients in waves. Set at the
    first handshake with a deployed node (strategies/nodes.py); a simulation keeps Flower's
    pool, since its few Ray workers queue the messages anyway and a message's timeout runs
    from its push."""
    server = Server(client_manager=SimpleClientManager(), strategy=strategy)
    strategy.nodes.on_deployed = lambda: server.set_max_workers(
        min(num_clients, MAX_MESSAGES_IN_FLIGHT))
    return server


app = ServerApp(server_fn=server_fn)
