"""Flower ClientApp: one NumPyClient of the configured algorithm per message.

The partition id comes from the node config (set by the simulation, or passed with
`flower-supernode --node-config "partition-id=3 num-partitions=10 data-root=/data"`).
Data is loaded and partitioned once per process and kept in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.client import Client, ClientApp, NumPyClient
from flwr.common import Context

from clients.base import handshake
from clients.faulty import FaultyClient
from fedapps.allocator import keep_freed_memory
from fedapps.data import federated_data
from fedapps.errors import ConfigError
from fedapps.packed_arrays import packed_arrays_mod
from fedapps.registry import ALGORITHMS, algo_settings
from fedapps.rundir import check_run_id
from fedapps.runtime import config_from_run, dataset_task, select_device, train_settings
from fedapps.timing import client_clocks, client_timing, node_stamps


def client_fn(context: Context) -> Client:
    """Build this node's client for one message (Flower calls it per message)."""
    made = client_clocks()  # the message's client time starts here
    cfg = config_from_run(context.run_config)
    node = context.node_config
    if "partition-id" not in node:
        raise ConfigError("node config: missing partition-id (flower-supernode --node-config "
                          "\"partition-id=<i> num-partitions=<n>\")")
    pid, n = int(node["partition-id"]), int(node.get("num-partitions", -1))
    num_clients = int(cfg.federation["num-clients"])
    if n != num_clients or not 0 <= pid < num_clients:
        raise ConfigError(f"node config: partition-id={pid} num-partitions={n} does not fit "
                          f"federation.num-clients={num_clients}")
    if "data-root" in node:
        cfg.data["data-root"] = str(node["data-root"])
    torch.set_num_threads(int(node.get("num-threads", 1)))
    keep_freed_memory()  # once per process: evaluation's batches reuse freed heap
    device = select_device(cfg)
    spec = ALGORITHMS[cfg.algorithm]
    local = spec.client_data(cfg, federated_data(cfg), pid, device)

    def build() -> NumPyClient:
        return spec.client(spec.model(cfg), local, train_settings(cfg), pid, context=context,
                           algo=algo_settings(cfg), device=device,
                           state_dir=client_state_dir(node, context.run_config, cfg, pid,
                                                      context.run_id),
                           task=dataset_task(cfg),
                           **spec.client_kwargs(cfg))

    if node.get("fault"):  # test deployments only (clients/faulty.py)
        return FaultyClient(build(), str(node["fault"]), float(node.get("fault-seconds", 3600)),
                            int(node.get("fault-from-round", 1))).to_client()
    return DeferredClient(pid, local, build, made, node_stamps(node)).to_client()


class DeferredClient(NumPyClient):
    """The algorithm's client, built only when a message needs a model. The server asks every
    node once for its partition and sizes before round 1 (strategies/nodes.py); answered from
    the data, that handshake costs no model construction, which with thousands of simulated
    nodes was most of the start-up (docs/PERFORMANCE.md, "Large federations")."""

    def __init__(self, partition_id: int, data: Any, build: Callable[[], NumPyClient],
                 made: tuple[float, float, float] | None = None,
                 stamps: Mapping[str, float] | None = None) -> None:
        self.partition_id, self.data, self.build = partition_id, data, build
        self.made = made  # client_clocks() when client_fn began, for timing
        self.stamps = stamps  # a warm ClientApp's stamps of the task (fedapps/timing.py)
        self.built: NumPyClient | None = None

    def client(self) -> NumPyClient:
        if self.built is None:
            self.built = self.build()
        return self.built

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        return handshake(self.partition_id, self.data)

    def get_parameters(self, config: dict[str, Any]) -> Any:
        return self.client().get_parameters(config)

    def fit(self, parameters: Any, config: dict[str, Any]) -> Any:
        """The client's answer, saying when this message's client work began (client_fn) and
        how long it took: the server splits each message's time with it (fedapps/timing.py)."""
        made = self.made or client_clocks()
        arrays, n, metrics = self.client().fit(parameters, config)
        return arrays, n, {**metrics, **client_timing(made, self.stamps)}

    def evaluate(self, parameters: Any, config: dict[str, Any]) -> Any:
        made = self.made or client_clocks()
        loss, n, metrics = self.client().evaluate(parameters, config)
        return loss, n, {**metrics, **client_timing(made, self.stamps)}


def client_state_dir(node: Mapping[str, Any], run_config: Mapping[str, Any], cfg,
                     partition_id: int, flower_run_id: int = 0) -> Path | None:
    """Personal client state on disk: the node's `state-dir` (deployment) or the run's
    `client-state-dir` (set by `fedapps run`), keyed by run name and run id. The run id comes
    from the run directory's claim (fedapps/rundir.py), so a resume finds its state and a fresh
    run under the same name never reads an older run's; a plain `flwr run` without one keys by
    Flower's own run id."""
    root = node.get("state-dir") or run_config.get("client-state-dir")
    if not root:
        return None
    run_id = check_run_id(str(run_config.get("run-id") or f"flwr-{flower_run_id}"))
    return Path(str(root)) / str(cfg.output["run-name"]) / run_id / f"partition-{partition_id}"


app = ClientApp(client_fn=client_fn, mods=[packed_arrays_mod])
