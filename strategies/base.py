"""The shared Strategy: a small Flower adaptor over plain modules.

Lifecycle of one round (docs/ARCHITECTURE.md): for each of its steps, plan -> fit -> check ->
aggregate (-> server optimizer step after the last step); then evaluate -> record ->
checkpoint. Each step is one Flower round; checkpoints follow every step.

An algorithm subclasses `BaseStrategy` and overrides only what differs: `steps_per_round`,
`plan` (who takes part and what each gets), `aggregate` (how answers combine),
`validate_metrics`, `eval_arrays`, and `state_arrays` / `load_state_arrays` for server state.
Sampling, upload checks, evaluation reduction and round records live in their own modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from logging import INFO, WARNING
from typing import Any, Protocol

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    log,
    ndarrays_to_parameters,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from fedapps.checkpoint import Snapshot
from fedapps.evaluation import reduce_evaluations
from fedapps.settings import AlgoSettings
from fedapps.tasks import TASKS, Task
from fedapps.timing import TIMING_KEYS
from strategies import uploads
from strategies.aggregation import weighted_average
from strategies.nodes import NodeDirectory, NodeFacts
from strategies.plan import (
    CROSS_EVALUATE,
    RESUMED_ROUND,
    RESUMED_STEP,
    TRAIN,
    WHOLE_ROUND,
    Assignment,
    RoundPlan,
)
from strategies.records import RoundLog, population, progress_line, round_record, step_line
from strategies.sampling import sample_clients, sample_evaluators
from strategies.steps import StepClock
from strategies.uploads import Upload, parameters_nbytes
from strategies.waiting import WAIT_REPORT_SECONDS, Waiting

__all__ = ["BaseStrategy", "TooFewClients", "Upload"]


class TooFewClients(RuntimeError):
    """Fewer valid updates than federation.min-fit-fraction requires: the run stops."""


class ServerStep(Protocol):
    """A server optimizer (strategies/server_opt.py): steps the round's aggregated change."""

    def step(self, current: list[np.ndarray], aggregated: list[np.ndarray],
             server_round: int) -> list[np.ndarray]: ...

    def state_arrays(self) -> dict[str, list[np.ndarray]]: ...

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None: ...


ROUND_START = "round-start"  # checkpoint name of the model a mid-round resume started from


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
        algo: AlgoSettings | None = None,
        on_round: Callable[[dict[str, Any]], None] | None = None,
        on_checkpoint: Callable[[Snapshot], None] | None = None,
        properties_timeout: float = 120.0,
        central_eval: Callable[[list[np.ndarray]], dict[str, float]] | None = None,
        on_too_few: str = "stop",
        on_stop: Callable[[str], None] | None = None,
        server_optimizer: ServerStep | None = None,
        task: Task | None = None,
        round_timeout: float | None = None,
        wait_report_seconds: float = WAIT_REPORT_SECONDS,
        partition_sizes: Sequence[tuple[int, int]] | None = None,
        max_update_norm: float | None = None,
        client_eval: bool = True,
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
        # False when clients hold no local test split (data.test-fraction 0, FedAIoT's
        # centralized test, seed 004 B13): the round is recorded after the server's evaluation
        self.client_eval = client_eval
        self.algo = algo if algo is not None else AlgoSettings()  # typed algo.* keys
        self.on_round = on_round
        self.on_checkpoint = on_checkpoint
        self.central_eval = central_eval  # e.g. the global model on the official test split
        self.on_too_few = on_too_few  # stop (default) or skip the step keeping the model
        self.on_stop = on_stop
        self.server_optimizer = server_optimizer
        self.task = task or TASKS["classification"]  # the dataset's: loss sums and metric
        # the server's own (train, test) size of each partition: bounds what nodes may claim
        self.nodes = NodeDirectory(num_clients, properties_timeout, partition_sizes)
        self.max_update_norm = max_update_norm  # federation.max-update-norm (None: no bound)
        # who a step still waits for, logged while clients are slow (Flower applies the timeout)
        self.waiting = Waiting(wait_report_seconds, round_timeout)
        self.steps_done = 0  # global steps completed before this process (a resume)
        # after a resume, sent with every instruction: clients ignore state on disk written
        # after this point, in a round the resume redoes (clients/state_files.py)
        self.resumed_after: dict[str, Scalar] = {}
        self.current: RoundLog | None = None
        self.current_plan: RoundPlan | None = None
        self.round_start: list[np.ndarray] | None = None  # the model the open round started from
        self.round_seconds: list[float] = []
        self._clock: StepClock | None = None

    # ---- steps ------------------------------------------------------------------------------
    def steps_per_round(self, server_round: int) -> int:
        """Steps of a round (default 1; a relay has one per hop, Fed-Star one per period)."""
        return 1

    @property
    def clock(self) -> StepClock:
        if self._clock is None:
            self._clock = StepClock(self.num_rounds, self.steps_per_round)
        return self._clock

    def is_last(self, server_round: int, step: int) -> bool:
        return step == self.steps_per_round(server_round) - 1

    def position(self, flower_round: int) -> tuple[int, int]:
        """(round, step) of a Flower server round, counting the steps done before a resume."""
        return self.clock.locate(flower_round + self.steps_done)

    def flower_rounds(self) -> int:
        """How many Flower rounds this process must run."""
        return self.clock.total - self.steps_done

    # ---- hooks ------------------------------------------------------------------------------
    def sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        """The round's participants (seeded; same seed and round -> same clients)."""
        return sample_clients(self.seed, server_round, available, self.clients_per_round)

    def plan(self, server_round: int, step: int, participants: list[int]) -> RoundPlan:
        """Who trains in this step and what each receives (default: every participant gets
        the whole global model and uploads its shared arrays)."""
        expected = self.shared_arrays()
        return self.make_plan(server_round, step,
                              [Assignment(pid, self.global_arrays, expected)
                               for pid in participants])

    def make_plan(self, server_round: int, step: int, assignments: list[Assignment]
                  ) -> RoundPlan:
        return RoundPlan(server_round, step, self.is_last(server_round, step), assignments)

    def eval_arrays(self, server_round: int, partition_id: int) -> list[np.ndarray]:
        """Arrays a client receives for evaluation (default: the whole global model)."""
        return self.global_arrays

    def shared_mask(self) -> list[bool]:
        """Which global arrays clients upload and the server averages (default: all of them;
        a prefix in `algo.shared-prefix`, e.g. 'base.', keeps the rest on the clients)."""
        prefix = self.algo.upload_prefix
        return [name.startswith(prefix) for name in self.array_names]

    def shared_arrays(self) -> list[np.ndarray]:
        return self.shared_part(self.global_arrays)

    def shared_part(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The positions of a full model that clients upload."""
        return [a for a, shared in zip(arrays, self.shared_mask(), strict=True) if shared]

    def merge(self, shared_arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The global arrays with the shared positions replaced by `shared_arrays`."""
        it = iter(shared_arrays)
        return [next(it) if shared else a
                for a, shared in zip(self.global_arrays, self.shared_mask(), strict=True)]

    def validate_metrics(self, metrics: dict[str, Scalar]) -> str | None:
        """Reason to reject a training answer's declared scalars, or None."""
        return None

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        """New global arrays from the step's valid uploads (default: FedAvg)."""
        return self.merge(weighted_average([u.arrays for u in uploads],
                                           [u.num_examples for u in uploads]))

    def state_arrays(self) -> dict[str, list[np.ndarray]]:
        """Server state beyond the global model that a checkpoint must keep (e.g. FedDyn's h)."""
        return {}

    def load_state_arrays(self, state: dict[str, list[np.ndarray]]) -> None:
        """Restore what `state_arrays` returned."""

    # ---- one step ---------------------------------------------------------------------------
    def open_step(self, server_round: int, step: int, available: Sequence[int]) -> RoundPlan:
        """Plan a step; the first step of a round opens its log and remembers its start model."""
        if self.current is None or self.current.round != server_round:
            self.current = RoundLog(server_round)
        if step == 0 or self.round_start is None:
            self.round_start = self.global_arrays
        plan = self.plan(server_round, step, self.sample(server_round, available))
        self.current_plan = plan
        self.current.add_clients(plan.partition_ids)
        self.current.instructions += len(plan.assignments)
        return plan

    def check_upload(self, res: FitRes, proxy: ClientProxy | None = None) -> Upload | str:
        """The answer checked against the open step's plan and bound to the node that sent
        it (`proxy`; None only in tests that bypass the node directory): an Upload or the
        reason."""
        if self.current_plan is None:
            return "no step is open"
        sender = self.nodes.facts_of(proxy)
        if proxy is not None and sender is None:
            return f"node {proxy.cid}: holds no partition"
        return uploads.check_upload(res, self.current_plan, self.validate_metrics,
                                    sender=sender, max_norm=self.max_update_norm)

    def server_update(self, server_round: int, aggregated: list[np.ndarray]
                      ) -> list[np.ndarray]:
        """The server optimizer's step on the round's change (none: the aggregate itself)."""
        if self.server_optimizer is None or self.round_start is None:
            return aggregated
        return self.server_optimizer.step(self.round_start, aggregated, server_round)

    def close_step(self, plan: RoundPlan) -> None:
        """After a step's aggregation: checkpoint inside a round (the last step checkpoints
        after its record)."""
        rlog = self.round_log(plan.round)
        rlog.steps += 1
        rlog.fit_done = time.perf_counter()
        if not plan.last_step:
            log(INFO, step_line(plan.round, self.num_rounds, plan.step,
                                self.steps_per_round(plan.round), rlog.fit_done - rlog.started))
            self.save_checkpoint(plan.round, plan.step)

    # ---- Strategy API -----------------------------------------------------------------------
    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(self.global_arrays)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        r, step = self.position(server_round)
        clients = self.nodes.clients_by_partition(client_manager)
        plan = self.open_step(r, step, list(clients))
        serialized: dict[int, Parameters] = {}  # one serialization per distinct array list
        instructions = []
        for a in plan.assignments:
            if a.partition_id not in clients:
                continue
            if id(a.arrays) not in serialized:  # setdefault would serialize every time
                serialized[id(a.arrays)] = ndarrays_to_parameters(a.arrays)
            params = serialized[id(a.arrays)]
            config: dict[str, Scalar] = {"server-round": r, **self.resumed_after, **a.config}
            if step:
                config["step"] = step
            if a.task != TRAIN:
                config["task"] = a.task
            instructions.append((a.partition_id, clients[a.partition_id], FitIns(params, config)))
            nbytes = parameters_nbytes(params)
            if a.task == CROSS_EVALUATE:
                self.current.bytes_down_xeval += nbytes  # type: ignore[union-attr]
            else:
                self.current.bytes_down += nbytes  # type: ignore[union-attr]
        steps = self.steps_per_round(r)
        label = f"round {r}" + (f" step {step + 1}/{steps}" if steps > 1 else "")
        return self.waiting.begin(label, instructions)

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        timings = self.waiting.end()
        r, step = self.position(server_round)
        plan = self.current_plan
        if plan is None or (plan.round, plan.step) != (r, step):
            raise RuntimeError(f"round {r} step {step}: answers arrived without a plan")
        rlog = self.round_log(r)
        rlog.add_timings("fit", timings)
        uploads: list[Upload] = []
        for proxy, res in results:
            sender = self.nodes.facts_of(proxy)
            pid = sender.partition_id if sender else res.metrics.get("partition-id")
            a = plan.get(pid) if isinstance(pid, int) else None
            nbytes = parameters_nbytes(res.parameters)
            if a is not None and a.task == CROSS_EVALUATE:
                rlog.bytes_up_xeval += nbytes
            else:
                rlog.bytes_up += nbytes
            checked = self.check_upload(res, proxy)
            if isinstance(checked, Upload):
                uploads.append(checked)
                rlog.fit_metrics[checked.partition_id] = {
                    k: v for k, v in checked.metrics.items()
                    if k != "partition-id" and k not in TIMING_KEYS}
            else:
                rlog.rejected += 1
                rlog.failure_reasons.append(checked)
                log(WARNING, "round %s: rejected update: %s", r, checked)
        for failure in failures:
            rlog.failures += 1
            reason = repr(failure) if isinstance(failure, BaseException) else "client failed"
            rlog.failure_reasons.append(reason[:200])
        sent = len(plan.assignments)
        needed = max(1, int(np.ceil(self.min_fit_fraction * max(sent, 1))))
        if len(uploads) < needed:
            where = f"round {r}" if self.steps_per_round(r) == 1 else f"round {r} step {step + 1}"
            reason = (f"{where}: {len(uploads)} valid updates of {sent} sampled clients, "
                      f"{needed} needed (federation.min-fit-fraction)")
            if self.on_too_few == "skip":
                log(WARNING, "%s; global model unchanged", reason)
                self.close_step(plan)
                return None, {}
            if self.on_stop:
                self.on_stop(reason)
            raise TooFewClients(f"{reason}; stopping. The checkpoint of the last completed "
                                "step is kept: continue with `fedapps resume <run dir>`")
        uploads.sort(key=lambda u: u.partition_id)  # arrival order must not change the sum
        new = self.aggregate(plan, uploads)
        if plan.last_step:
            new = self.server_update(r, new)
        self.global_arrays = new
        self.close_step(plan)
        return ndarrays_to_parameters(self.global_arrays), {}

    def eval_sample(self, server_round: int, available: Sequence[int]) -> list[int]:
        return sample_evaluators(self.seed, server_round, available, self.eval_fraction)

    def eval_contract(self, server_round: int) -> list[int]:
        """Who must evaluate for the round's G to be complete: every client, or the seeded
        eval.fraction sample drawn from all of them (not from those that happen to be up,
        so a node being down cannot change who else is asked)."""
        return self.eval_sample(server_round, range(self.num_clients))

    def eval_due(self, server_round: int) -> bool:
        return server_round % self.eval_every == 0 or server_round == self.num_rounds

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager
                           ) -> list[tuple[ClientProxy, EvaluateIns]]:
        r, step = self.position(server_round)
        if not self.is_last(r, step):
            return []
        if not self.eval_due(r) or not self.client_eval:
            self.finish_round(r, {})
            return []
        clients = self.nodes.clients_by_partition(client_manager)
        rlog = self.round_log(r)
        rlog.eval_expected = self.eval_contract(r)
        instructions = []
        for pid in rlog.eval_expected:
            if pid not in clients:
                continue
            params = ndarrays_to_parameters(self.eval_arrays(r, pid))
            self.round_log(r).bytes_down_eval += parameters_nbytes(params)
            config = {"server-round": r, **self.resumed_after}
            instructions.append((pid, clients[pid], EvaluateIns(params, config)))
        return self.waiting.begin(f"round {r} evaluation", instructions)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        timings = self.waiting.end()
        r, _ = self.position(server_round)
        self.round_log(r).add_timings("evaluate", timings)
        metrics = self.evaluation_metrics([res for _, res in results],
                                          [self.nodes.facts_of(p) for p, _ in results])
        metrics["eval_failures"] = len(failures)
        expected = self.round_log(r).eval_expected
        if expected is not None:
            metrics.update(population(metrics["eval_population"], expected))
        self.finish_round(r, metrics)
        return metrics.get("loss"), {k: v for k, v in metrics.items()
                                     if isinstance(v, int | float) and not isinstance(v, bool)}

    def evaluate(self, server_round: int, parameters: Parameters
                 ) -> tuple[float, dict[str, Scalar]] | None:
        """Server-side evaluation of the round's global model, when the app gave one (not of
        the initial model: Flower asks with server_round 0)."""
        if server_round < 1:
            return None
        r, step = self.position(server_round)
        if self.central_eval is None or not self.is_last(r, step):
            return None
        if not self.client_eval and not self.eval_due(r):  # the only evaluation: eval-every
            return None
        metrics = self.central_eval(self.global_arrays)
        self.round_log(r).central = metrics
        return float(metrics.get("official_test_loss", 0.0)), dict(metrics)

    # ---- evaluation and bookkeeping -----------------------------------------------------------
    def evaluation_metrics(self, results: list[EvaluateRes],
                           senders: Sequence[NodeFacts | None] | None = None
                           ) -> dict[str, Any]:
        """G and P pooled over the clients' local test splits (evaluation contract: exact
        micro-averages for accuracy, R^2 from pooled sums), per-client percentiles, and each
        client's score (index = partition id). Each answer is checked first and bound to its
        sender's handshake (uploads.check_evaluation); rejected ones are counted, with their
        reasons, and left out, as is a second answer for one partition."""
        rows, reasons = [], []
        for res, sender in zip(results, senders or [None] * len(results), strict=True):
            checked = uploads.check_evaluation(res, self.task, self.num_clients, sender)
            if isinstance(checked, str):
                reasons.append(checked)
            elif any(row[0] == checked[0] for row in rows):
                reasons.append(f"client {checked[0]}: a second evaluation; ignored")
            else:
                rows.append(checked)
        for reason in reasons:
            log(WARNING, "rejected evaluation: %s", reason)
        rows.sort(key=lambda row: row[0])  # arrival order must not change the sums
        metrics = reduce_evaluations(self.task, rows, self.num_clients)
        metrics["eval_population"] = [row[0] for row in rows]
        metrics["eval_rejected"] = len(reasons)
        metrics["eval_failure_reasons"] = reasons
        return metrics

    def round_log(self, server_round: int) -> RoundLog:
        """The open round's log (opened here if no step was planned, e.g. in tests)."""
        if self.current is None or self.current.round != server_round:
            self.current = RoundLog(server_round)
        return self.current

    def finish_round(self, server_round: int, metrics: dict[str, Any]) -> None:
        record = round_record(self.round_log(server_round), metrics, self.task.metric)
        self.round_seconds.append(record["seconds"])
        self.current = None
        self.current_plan = None
        self.round_start = None
        eta = float(np.mean(self.round_seconds[-5:])) * (self.num_rounds - server_round)
        log(INFO, progress_line(record, self.num_rounds, eta, self.task.metric))
        if self.on_round:
            self.on_round(record)  # results first: a crash in between repeats this round
        self.save_checkpoint(server_round, None)

    # ---- checkpoints --------------------------------------------------------------------------
    def snapshot(self, server_round: int, step: int | None) -> Snapshot:
        """Everything a resume needs after (round, step); step None = the round is complete."""
        state = dict(self.state_arrays())
        if self.server_optimizer is not None:  # its names start with server_opt_
            state.update(self.server_optimizer.state_arrays())
        open_round = None
        if step is not None:
            if self.round_start is not None:
                state[ROUND_START] = list(self.round_start)
            open_round = self.round_log(server_round).to_json()
        return Snapshot(server_round, list(self.global_arrays), state, step, open_round)

    def save_checkpoint(self, server_round: int, step: int | None) -> None:
        if self.on_checkpoint:
            self.on_checkpoint(self.snapshot(server_round, step))

    def resume(self, snap: Snapshot) -> None:
        """Continue after a snapshot: sampling, plans and client seeds depend only on
        (seed, round, step) and the restored state, so the numbers repeat."""
        if snap.step is None:
            self.steps_done = self.clock.ends[snap.round - 1] if snap.round else 0
        else:
            self.steps_done = self.clock.index(snap.round, snap.step)
            self.current = RoundLog.from_json(snap.open_round or "{}")
            self.round_start = snap.state.get(ROUND_START)
        self.resumed_after = {RESUMED_ROUND: snap.round,
                              RESUMED_STEP: WHOLE_ROUND if snap.step is None else snap.step}
        self.global_arrays = [np.asarray(a) for a in snap.global_arrays]
        state = {k: v for k, v in snap.state.items() if k != ROUND_START}
        self.load_state_arrays(state)  # each part reads its own names
        if self.server_optimizer is not None:
            self.server_optimizer.load_state_arrays(state)
