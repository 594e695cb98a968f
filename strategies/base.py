"""The shared Strategy: seeded sampling by partition id, update validation, all-client G/P
evaluation, per-round bookkeeping (bytes, failures, time) and progress output.

An algorithm's strategy subclasses `BaseStrategy` and overrides only the hooks that differ:
`fit_arrays` (what a client receives), `aggregate` (how uploads combine), `fit_config`
(extra per-round instructions) and `expected_upload` (what a valid upload looks like).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetPropertiesIns,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from strategies.aggregation import weighted_average


class TooFewClients(RuntimeError):
    """Fewer valid updates than federation.min-fit-fraction requires: the run stops."""


@dataclass
class Upload:
    """One validated client update."""

    partition_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar]


@dataclass
class RoundLog:
    """What a round accumulates between configure_fit and the end of evaluation."""

    round: int
    started: float
    fit_done: float | None = None  # when aggregation finished: splits fit and eval time
    fit_clients: list[int] = field(default_factory=list)
    bytes_down: int = 0
    bytes_up: int = 0
    bytes_down_eval: int = 0
    failures: int = 0
    rejected: int = 0
    fit_metrics: dict[int, dict[str, Scalar]] = field(default_factory=dict)
    central: dict[str, float] = field(default_factory=dict)
    failure_reasons: list[str] = field(default_factory=list)


def parameters_nbytes(parameters: Parameters) -> int:
    return sum(len(t) for t in parameters.tensors)


def _percentiles(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values)
    p10, p50, p90 = np.percentile(arr, [10, 50, 90])
    return {f"{prefix}_p10": float(p10), f"{prefix}_p50": float(p50),
            f"{prefix}_p90": float(p90), f"{prefix}_std": float(arr.std())}


class BaseStrategy(Strategy):
    """FedAvg behaviour plus everything every algorithm shares."""

    def __init__(
        self,
        *,
        initial_arrays: list[np.ndarray],
        array_names: list[str] | None = None,
        num_rounds: int,
        num_clients: int,
        clients_per_round: int,
        seed: int,
        min_fit_fraction: float = 0.5,
        eval_every: int = 1,
        eval_fraction: float = 1.0,
        algo: dict[str, Any] | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        properties_timeout: float = 120.0,
        central_eval: Callable[[list[np.ndarray]], dict[str, float]] | None = None,
        on_too_few: str = "stop",
        on_stop: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.global_arrays = [np.asarray(a) for a in initial_arrays]
        # state_dict names of the arrays ("base.*" / "head.*"), for split aggregation
        self.array_names = array_names or [f"array.{i}" for i in range(len(initial_arrays))]
        self.num_rounds = num_rounds
        self.num_clients = num_clients
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.min_fit_fraction = min_fit_fraction
        self.eval_every = eval_every
        self.eval_fraction = eval_fraction
        self.algo = algo or {}
        self.on_round = on_round
        self.properties_timeout = properties_timeout
        self.central_eval = central_eval  # e.g. the global model on the official test split
        self.on_too_few = on_too_few  # stop (default) or skip the round keeping the model
        self.on_stop = on_stop
        self.partition_of: dict[str, int] = {}  # node id (cid) -> partition id
        self.round_offset = 0  # rounds done before a resume: Flower counts from 1 again
        self.current: RoundLog | None = None
        self.round_seconds: list[float] = []

    # ---- client identity and sampling ---------------------------------------------------------
    def clients_by_partition(self, client_manager: ClientManager) -> dict[int, ClientProxy]:
        """Connected clients keyed by partition id, asking each new node once."""
        if not self.partition_of:
            client_manager.wait_for(self.num_clients, timeout=int(self.properties_timeout))
        proxies = client_manager.all()
        unknown = [p for cid, p in proxies.items() if cid not in self.partition_of]
        if unknown:
            ins = GetPropertiesIns(config={})
            with ThreadPoolExecutor(max_workers=min(32, len(unknown))) as pool:
                answers = list(pool.map(
                    lambda p: p.get_properties(ins, timeout=self.properties_timeout, group_id=0),
                    unknown))
            for proxy, res in zip(unknown, answers, strict=True):
                pid = res.properties.get("partition-id")
                if isinstance(pid, int) and 0 <= pid < self.num_clients:
                    # a restarted node comes back with a new id: forget the old one
                    for old in [c for c, p in self.partition_of.items() if p == pid]:
                        del self.partition_of[old]
                    self.partition_of[proxy.cid] = pid
                else:
                    log(WARNING, "node %s reported partition-id %r; ignored", proxy.cid, pid)
        by_pid: dict[int, ClientProxy] = {}
        for cid, proxy in proxies.items():
            if cid in self.partition_of:
                by_pid[self.partition_of[cid]] = proxy
        return by_pid

    def sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        """Seeded uniform sample without replacement; same seed and round -> same clients."""
        rng = np.random.default_rng([self.seed, server_round])
        pool = sorted(available)
        k = min(self.clients_per_round, len(pool))
        return sorted(int(p) for p in rng.choice(pool, size=k, replace=False))

    # ---- hooks ------------------------------------------------------------------------------
    def fit_config(self, server_round: int, partition_id: int) -> dict[str, Scalar]:
        """Extra per-client fit instructions."""
        return {}

    def fit_arrays(self, server_round: int, partition_id: int) -> list[np.ndarray]:
        """Arrays a client receives for training (default: the whole global model)."""
        return self.global_arrays

    def eval_arrays(self, server_round: int, partition_id: int) -> list[np.ndarray]:
        """Arrays a client receives for evaluation (default: the whole global model)."""
        return self.global_arrays

    def shared_mask(self) -> list[bool]:
        """Which global arrays clients upload and the server averages (default: all of them;
        a prefix in `algo.shared-prefix`, e.g. 'base.', keeps the rest on the clients)."""
        prefix = str(self.algo.get("shared-prefix", ""))
        return [name.startswith(prefix) for name in self.array_names]

    def expected_upload(self, partition_id: int) -> list[np.ndarray]:
        """Arrays whose shapes and dtypes a valid upload must match."""
        return [a for a, shared in zip(self.global_arrays, self.shared_mask(), strict=True)
                if shared]

    def merge(self, shared_arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The global arrays with the shared positions replaced by `shared_arrays`."""
        it = iter(shared_arrays)
        return [next(it) if shared else a
                for a, shared in zip(self.global_arrays, self.shared_mask(), strict=True)]

    def validate_metrics(self, metrics: dict[str, Scalar]) -> str | None:
        """Reason to reject an upload's declared scalars, or None."""
        return None

    def aggregate(self, server_round: int, uploads: list[Upload]) -> list[np.ndarray]:
        """New global arrays from the round's valid uploads (default: FedAvg)."""
        return self.merge(weighted_average([u.arrays for u in uploads],
                                           [u.num_examples for u in uploads]))

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        """Server state beyond the global model that a checkpoint must keep (e.g. FedDyn's h)."""
        return {}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        """Restore what `state_arrays` returned."""

    def resume_from(self, completed_round: int, global_arrays: list[np.ndarray],
                    state: dict[str, list[np.ndarray]]) -> None:
        """Continue after `completed_round`: sampling and client seeds depend only on
        (seed, round), so nothing else needs restoring."""
        self.round_offset = completed_round
        self.global_arrays = [np.asarray(a) for a in global_arrays]
        self.load_state_arrays(state)

    # ---- Strategy API -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(self.global_arrays)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        server_round += self.round_offset
        self.current = RoundLog(server_round, time.perf_counter())
        clients = self.clients_by_partition(client_manager)
        chosen = self.sample(server_round, list(clients))
        instructions = []
        for pid in chosen:
            params = ndarrays_to_parameters(self.fit_arrays(server_round, pid))
            config: dict[str, Scalar] = {"server-round": server_round,
                                         **self.fit_config(server_round, pid)}
            instructions.append((clients[pid], FitIns(params, config)))
            self.current.bytes_down += parameters_nbytes(params)
        self.current.fit_clients = chosen
        return instructions

    def check_upload(self, res: FitRes) -> Upload | str:
        """A valid Upload, or the reason the update is rejected (never raises)."""
        pid = res.metrics.get("partition-id")
        if not isinstance(pid, int):
            return "missing partition-id"
        try:
            arrays = parameters_to_ndarrays(res.parameters)  # np.load(allow_pickle=False)
        except Exception as err:  # malformed bytes from the network
            return f"client {pid}: undecodable arrays ({type(err).__name__})"
        expected = self.expected_upload(pid)
        if len(arrays) != len(expected):
            return f"client {pid}: {len(arrays)} arrays, expected {len(expected)}"
        for i, (got, want) in enumerate(zip(arrays, expected, strict=True)):
            if got.shape != want.shape or got.dtype != want.dtype:
                return (f"client {pid}: array {i} is {got.dtype}{list(got.shape)}, expected "
                        f"{want.dtype}{list(want.shape)}")
            if got.dtype.kind == "f" and not np.all(np.isfinite(got)):
                return f"client {pid}: array {i} has NaN or Inf"
        if not isinstance(res.num_examples, int) or res.num_examples <= 0:
            return f"client {pid}: num_examples={res.num_examples} must be > 0"
        reason = self.validate_metrics(res.metrics)
        if reason:
            return f"client {pid}: {reason}"
        return Upload(pid, arrays, res.num_examples, dict(res.metrics))

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        server_round += self.round_offset
        rlog = self.round_log(server_round)
        uploads: list[Upload] = []
        for _, res in results:
            rlog.bytes_up += parameters_nbytes(res.parameters)
            checked = self.check_upload(res)
            if isinstance(checked, Upload):
                uploads.append(checked)
                rlog.fit_metrics[checked.partition_id] = {
                    k: v for k, v in checked.metrics.items() if k != "partition-id"}
            else:
                rlog.rejected += 1
                rlog.failure_reasons.append(checked)
                log(WARNING, "round %s: rejected update: %s", server_round, checked)
        for failure in failures:
            rlog.failures += 1
            reason = repr(failure) if isinstance(failure, BaseException) else "client failed"
            rlog.failure_reasons.append(reason[:200])
        needed = max(1, int(np.ceil(self.min_fit_fraction * max(len(rlog.fit_clients), 1))))
        if len(uploads) < needed:
            reason = (f"round {server_round}: {len(uploads)} valid updates of "
                      f"{len(rlog.fit_clients)} sampled clients, {needed} needed "
                      "(federation.min-fit-fraction)")
            if self.on_too_few == "skip":
                log(WARNING, "%s; global model unchanged", reason)
                return None, {}
            if self.on_stop:
                self.on_stop(reason)
            raise TooFewClients(f"{reason}; stopping. The checkpoint of the last completed "
                                "round is kept: continue with `fedapps resume <run dir>`")
        uploads.sort(key=lambda u: u.partition_id)  # arrival order must not change the sum
        self.global_arrays = self.aggregate(server_round, uploads)
        rlog.fit_done = time.perf_counter()
        return ndarrays_to_parameters(self.global_arrays), {}

    def eval_sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        """All clients (the evaluation contract), or a seeded `eval_fraction` of them for
        large federations."""
        pool = sorted(available)
        if self.eval_fraction >= 1.0:
            return pool
        k = max(1, int(np.ceil(self.eval_fraction * len(pool))))
        rng = np.random.default_rng([self.seed, server_round, 1])
        return sorted(int(p) for p in rng.choice(pool, size=k, replace=False))

    def eval_due(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        server_round += self.round_offset
        if not self.eval_due(server_round):
            self.finish_round(server_round, {})
            return []
        clients = self.clients_by_partition(client_manager)
        instructions = []
        for pid in self.eval_sample(server_round, list(clients)):
            params = ndarrays_to_parameters(self.eval_arrays(server_round, pid))
            if self.current:
                self.current.bytes_down_eval += parameters_nbytes(params)
            instructions.append((clients[pid], EvaluateIns(params, {"server-round": server_round})))
        return instructions

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        server_round += self.round_offset
        metrics = self.evaluation_metrics([res for _, res in results])
        metrics["eval_failures"] = len(failures)
        self.finish_round(server_round, metrics)
        return metrics.get("loss"), {k: v for k, v in metrics.items()
                                     if isinstance(v, int | float) and not isinstance(v, bool)}

    def evaluate(self, server_round: int, parameters: Parameters
                 ) -> tuple[float, dict[str, Scalar]] | None:
        """Server-side evaluation of the new global model, when the app gave one."""
        if self.central_eval is None:
            return None
        metrics = self.central_eval(self.global_arrays)
        self.round_log(server_round + self.round_offset).central = metrics
        return float(metrics.get("official_test_loss", 0.0)), dict(metrics)

    # ---- evaluation and bookkeeping -----------------------------------------------------------
    def evaluation_metrics(self, results: list[EvaluateRes]) -> dict[str, Any]:
        """G and P as micro-averages over all clients' local test splits (evaluation contract),
        per-client accuracy percentiles, and each client's accuracies (index = partition id)."""
        n = sum(r.num_examples for r in results)
        correct_g = sum(int(r.metrics["correct-global"]) for r in results)
        correct_p = sum(int(r.metrics["correct-personal"]) for r in results)
        loss = sum(r.loss * r.num_examples for r in results) / n if n else None
        per_g: list[float | None] = [None] * self.num_clients
        per_p: list[float | None] = [None] * self.num_clients
        for r in results:
            pid = r.metrics.get("partition-id")
            if r.num_examples and isinstance(pid, int) and 0 <= pid < self.num_clients:
                per_g[pid] = int(r.metrics["correct-global"]) / r.num_examples
                per_p[pid] = int(r.metrics["correct-personal"]) / r.num_examples
        return {
            "global_accuracy": correct_g / n if n else None,
            "personal_accuracy": correct_p / n if n else None,
            "loss": loss,
            "eval_clients": len(results),
            "eval_samples": n,
            **_percentiles([a for a in per_g if a is not None], "global_client"),
            **_percentiles([a for a in per_p if a is not None], "personal_client"),
            "client_global_accuracy": per_g,
            "client_personal_accuracy": per_p,
            # clients whose personal state came back from state-dir (a restarted node)
            "clients_state_from_disk": sorted(
                int(r.metrics["partition-id"]) for r in results
                if r.metrics.get("state-from-disk") == 1),
        }

    def round_log(self, server_round: int) -> RoundLog:
        """The open round's log (opened here if configure_fit did not run, e.g. in tests)."""
        if self.current is None or self.current.round != server_round:
            self.current = RoundLog(server_round, time.perf_counter())
        return self.current

    def finish_round(self, server_round: int, metrics: dict[str, Any]) -> None:
        rlog = self.round_log(server_round)
        now = time.perf_counter()
        seconds = now - rlog.started
        fit_seconds = (rlog.fit_done or now) - rlog.started
        self.round_seconds.append(seconds)
        record = {
            "round": server_round,
            "global_accuracy": metrics.pop("global_accuracy", None),
            "personal_accuracy": metrics.pop("personal_accuracy", None),
            "bytes_down": rlog.bytes_down,
            "bytes_up": rlog.bytes_up,
            "bytes_down_eval": rlog.bytes_down_eval,
            "seconds": seconds,
            "fit_seconds": fit_seconds,
            "eval_seconds": seconds - fit_seconds,
            "fit_clients": rlog.fit_clients,
            "failures": rlog.failures + rlog.rejected,
            "rejected_updates": rlog.rejected,
            "failure_reasons": rlog.failure_reasons,
            "client_fit_metrics": {str(k): v for k, v in sorted(rlog.fit_metrics.items())},
            **rlog.central,
            **metrics,
        }
        self.current = None
        self.log_progress(record)
        if self.on_round:
            self.on_round(record)

    def log_progress(self, record: dict[str, Any]) -> None:
        def pct(v: float | None) -> str:
            return "   -  " if v is None else f"{100 * v:5.2f}%"

        r = record["round"]
        eta = np.mean(self.round_seconds[-5:]) * (self.num_rounds - r)
        log(INFO, "[fedapps] round %d/%d  G %s  P %s  fit %d/%d  failures %d  %.1fs  ETA %.0fs",
            r, self.num_rounds, pct(record["global_accuracy"]), pct(record["personal_accuracy"]),
            len(record["fit_clients"]) - record["failures"], len(record["fit_clients"]),
            record["failures"], record["seconds"], eta)
