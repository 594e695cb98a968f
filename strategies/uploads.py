"""Client answers checked before anything is aggregated or scored; nothing a client claims is
trusted further than the server can check it.

Training answers (`check_upload`): bound to the node the server sent the instruction to (a
claimed partition id must be that node's), decoded with allow_pickle=False, matched to the
assignment's expected shapes and dtypes, finite, with a sample count in 1..the node's
training-set size from its handshake, optionally a change norm within
`federation.max-update-norm`, and, for a cross-evaluation, one finite score per model.
Evaluation answers (`check_evaluation`): the same binding, n = the node's test-split size,
and sums the task can have produced (e.g. 0 <= correct <= n).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.common import EvaluateRes, FitRes, Parameters, Scalar, parameters_to_ndarrays

from fedapps.evaluation import ClientEvaluation
from fedapps.tasks import Task
from strategies.nodes import NodeFacts, is_count
from strategies.plan import CROSS_EVALUATE, Assignment, RoundPlan


@dataclass
class Upload:
    """One validated client answer."""

    partition_id: int
    arrays: list[np.ndarray]
    num_examples: int
    metrics: dict[str, Scalar]

    def scores(self, num_models: int) -> list[float]:
        """A cross-evaluation's scores, one per model, in the order the models were sent."""
        return [float(self.metrics[f"score-{i}"]) for i in range(num_models)]


def parameters_nbytes(parameters: Parameters) -> int:
    """Bytes of the serialized arrays of one message."""
    return sum(len(t) for t in parameters.tensors)


def claimed_partition(metrics: dict[str, Scalar], sender: NodeFacts | None) -> int | str:
    """The partition an answer belongs to: the sender's (the node the server asked), which
    a claimed `partition-id` must match; without a known sender, the claim itself."""
    pid = metrics.get("partition-id")
    if not is_count(pid):
        return f"partition-id={pid!r} is not a partition id"
    if sender is not None and pid != sender.partition_id:
        return (f"client {sender.partition_id}: answer claims partition-id={pid!r} (not the "
                "node's own)")
    return int(pid)  # type: ignore[arg-type]


def max_examples(assignment: Assignment, sender: NodeFacts | None) -> int | None:
    """The most samples the sender can have used: its training set, or for a cross-evaluation
    the split it scores on (None: no handshake to bound it by)."""
    if sender is None:
        return None
    if assignment.task == CROSS_EVALUATE and assignment.config.get("split") == "test":
        return sender.num_test
    return sender.num_train


def change_norm(arrays: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """L2 norm of (upload - reference) over the float arrays, in float64."""
    total = 0.0
    for got, ref in zip(arrays, reference, strict=True):
        if got.dtype.kind == "f":
            diff = got.astype(np.float64) - np.asarray(ref, dtype=np.float64)
            total += float(np.dot(diff.ravel(), diff.ravel()))
    return math.sqrt(total)


def check_upload(res: FitRes, plan: RoundPlan,
                 validate_metrics: Callable[[dict[str, Scalar]], str | None] | None = None,
                 sender: NodeFacts | None = None, max_norm: float | None = None
                 ) -> Upload | str:
    """A valid Upload, or the reason the answer is rejected (never raises). `sender`: the
    handshake of the node that answered (None only where no node directory is involved)."""
    pid = claimed_partition(res.metrics, sender)
    if isinstance(pid, str):
        return pid
    assignment = plan.get(pid)
    if assignment is None:
        return f"client {pid}: not part of round {plan.round} step {plan.step}"
    expected = assignment.expected
    if len(res.parameters.tensors) != len(expected):  # counted before anything is decoded
        return f"client {pid}: {len(res.parameters.tensors)} arrays, expected {len(expected)}"
    try:
        arrays = parameters_to_ndarrays(res.parameters)  # np.load(allow_pickle=False)
    except Exception as err:  # malformed bytes from the network
        return f"client {pid}: undecodable arrays ({type(err).__name__})"
    for i, (got, want) in enumerate(zip(arrays, expected, strict=True)):
        if got.shape != want.shape or got.dtype != want.dtype:
            return (f"client {pid}: array {i} is {got.dtype}{list(got.shape)}, expected "
                    f"{want.dtype}{list(want.shape)}")
        if got.dtype.kind == "f" and not np.all(np.isfinite(got)):
            return f"client {pid}: array {i} has NaN or Inf"
    n = res.num_examples
    if not is_count(n) or n <= 0:
        return f"client {pid}: num_examples={n!r} must be > 0"
    bound = max_examples(assignment, sender)
    if bound is not None and n > bound:
        return f"client {pid}: num_examples={n} exceeds its {bound} samples (handshake)"
    if max_norm is not None and arrays:
        reference = assignment.reference if assignment.reference is not None else expected
        norm = change_norm(arrays, reference)
        if norm > max_norm:
            return (f"client {pid}: update norm {norm:.4g} exceeds "
                    f"federation.max-update-norm={max_norm:g}")
    if assignment.task == CROSS_EVALUATE:
        for i in range(assignment.num_scores):
            score = res.metrics.get(f"score-{i}")
            if isinstance(score, bool) or not isinstance(score, int | float) \
                    or not math.isfinite(score):
                return f"client {pid}: score-{i}={score!r} must be a finite number"
    elif validate_metrics is not None:
        reason = validate_metrics(res.metrics)
        if reason:
            return f"client {pid}: {reason}"
    return Upload(pid, arrays, n, dict(res.metrics))


def check_evaluation(res: EvaluateRes, task: Task, num_clients: int,
                     sender: NodeFacts | None = None) -> ClientEvaluation | str:
    """One client's evaluation as (partition id, n, loss, metrics), or why it is rejected:
    a partition id other than the sender's, n other than its test-split size, or sums the
    task cannot produce from n samples (task.check_sums)."""
    pid = claimed_partition(res.metrics, sender)
    if isinstance(pid, str):
        return pid
    if pid >= num_clients:
        return f"partition-id={pid} is not in 0..{num_clients - 1}"
    n = res.num_examples
    if not is_count(n):
        return f"client {pid}: num_examples={n!r} must be a count"
    if sender is not None and n != sender.num_test:
        return f"client {pid}: evaluated {n} samples, its test split has {sender.num_test}"
    reason = task.check_sums(n, res.metrics)
    if reason:
        return f"client {pid}: {reason}"
    return pid, n, float(res.loss), dict(res.metrics)
