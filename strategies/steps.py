"""Steps within a round: Flower's server rounds map to (round, step).

An algorithm may run several steps per round (a relay hop of Fed-Cyclic, a period of Fed-Star
or RingFed). Each step is one Flower round (fit, then evaluation only after the last step), as
Flower's own cyclic XGBoost strategy does; see docs/ARCHITECTURE.md for why.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from itertools import accumulate


class StepClock:
    """Global step index k (1-based, as Flower counts rounds) <-> (round from 1, step from 0)."""

    def __init__(self, rounds: int, steps_in: Callable[[int], int]) -> None:
        counts = [int(steps_in(r)) for r in range(1, rounds + 1)]
        if any(c < 1 for c in counts):
            raise ValueError(f"every round needs at least one step, got {counts}")
        self.rounds = rounds
        self.counts = counts
        self.ends = list(accumulate(counts))  # global index of each round's last step

    @property
    def total(self) -> int:
        return self.ends[-1] if self.ends else 0

    def steps(self, server_round: int) -> int:
        return self.counts[server_round - 1]

    def locate(self, k: int) -> tuple[int, int]:
        """(round, step) of global step k."""
        if not 1 <= k <= self.total:
            raise ValueError(f"step {k} outside 1..{self.total}")
        r = bisect_right(self.ends, k - 1)  # rounds wholly before k
        start = self.ends[r - 1] if r else 0
        return r + 1, k - start - 1

    def index(self, server_round: int, step: int) -> int:
        """Global index of (round, step)."""
        start = self.ends[server_round - 2] if server_round > 1 else 0
        return start + step + 1

    def is_last(self, server_round: int, step: int) -> bool:
        return step == self.counts[server_round - 1] - 1
