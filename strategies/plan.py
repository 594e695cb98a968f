"""Round plans: one call per (round, step) decides who takes part and what each one gets.

A plan is a plain value. Payloads, upload validation and aggregation all read the same plan,
so no hook depends on another hook's side effects (a sub-model's index set, a client's role,
the models a client is asked to score all travel in its `Assignment`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TRAIN = "train"
CROSS_EVALUATE = "cross-evaluate"
EVALUATE = "evaluate"
TASKS = (TRAIN, CROSS_EVALUATE, EVALUATE)

# After a resume every instruction also carries the checkpoint's round and last completed step
# (WHOLE_ROUND: the round was complete): clients read no state a redone round wrote
# (clients/state_files.py).
RESUMED_ROUND = "resumed-round"
RESUMED_STEP = "resumed-step"
WHOLE_ROUND = -1


@dataclass
class Assignment:
    """What one client receives in one step and what a valid answer looks like.

    `arrays` go down; `expected` gives the shapes and dtypes of a valid upload (empty for a
    cross-evaluation, which answers with scores only); `num_scores` is how many `score-<i>`
    metrics a cross-evaluation must return; `role` is algorithm-specific (e.g. phase-shift's
    fresh / correct / return); `facts` holds what aggregation needs about this client (e.g. the
    index sets of its sub-model); `reference` is what the upload's change is measured from
    for `federation.max-update-norm` (default `expected`: the arrays the client received at
    the uploaded positions)."""

    partition_id: int
    arrays: list[np.ndarray]
    expected: list[np.ndarray]
    config: dict[str, Any] = field(default_factory=dict)
    task: str = TRAIN
    role: str = TRAIN
    num_scores: int = 0
    facts: dict[str, Any] = field(default_factory=dict)
    reference: list[np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r}: allowed: {', '.join(TASKS)}")


@dataclass
class RoundPlan:
    """The assignments of one step of one round (round from 1, step from 0)."""

    round: int
    step: int
    last_step: bool
    assignments: list[Assignment]

    def get(self, partition_id: int) -> Assignment | None:
        for a in self.assignments:
            if a.partition_id == partition_id:
                return a
        return None

    @property
    def partition_ids(self) -> list[int]:
        return [a.partition_id for a in self.assignments]


def cross_evaluation(partition_id: int, models: Sequence[Sequence[np.ndarray]],
                     split: str = "train", **facts: Any) -> Assignment:
    """Ask one client to score several models sent together (e.g. Fed-Star's peers): the
    arrays of all models are concatenated; the client answers one `score-<i>` per model."""
    if not models:
        raise ValueError("a cross-evaluation needs at least one model")
    sizes = {len(m) for m in models}
    if len(sizes) != 1:
        raise ValueError(f"models of different array counts {sorted(sizes)}")
    arrays = [a for m in models for a in m]
    return Assignment(partition_id, arrays, [], {"num-models": len(models), "split": split},
                      task=CROSS_EVALUATE, role=CROSS_EVALUATE, num_scores=len(models),
                      facts=dict(facts))
