"""Client answers checked against the plan before anything is aggregated: decoded with
allow_pickle=False, matched to the assignment's expected shapes and dtypes, finite, with a
positive sample count and, for a cross-evaluation, one finite score per model."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.common import FitRes, Parameters, Scalar, parameters_to_ndarrays

from strategies.plan import CROSS_EVALUATE, RoundPlan


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


def check_upload(res: FitRes, plan: RoundPlan,
                 validate_metrics: Callable[[dict[str, Scalar]], str | None] | None = None
                 ) -> Upload | str:
    """A valid Upload, or the reason the answer is rejected (never raises)."""
    pid = res.metrics.get("partition-id")
    if not isinstance(pid, int) or isinstance(pid, bool):
        return "missing partition-id"
    assignment = plan.get(pid)
    if assignment is None:
        return f"client {pid}: not part of round {plan.round} step {plan.step}"
    try:
        arrays = parameters_to_ndarrays(res.parameters)  # np.load(allow_pickle=False)
    except Exception as err:  # malformed bytes from the network
        return f"client {pid}: undecodable arrays ({type(err).__name__})"
    expected = assignment.expected
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
    return Upload(pid, arrays, res.num_examples, dict(res.metrics))
