"""FedReb / FedReG strategy: split base/head aggregation (seed 000 eqs. 3.5-3.10, DECISIONS).

The base is weighted by each client's original train size n_orig (its `num_examples`), the
global head H1 by its effective samples n_eff (reported as the `n-eff` metric). Option
`aggregation: origin` (seed 001 ablation a) weights the whole model by n_orig.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Scalar

from strategies.aggregation import split_average
from strategies.base import BaseStrategy, Upload
from strategies.plan import RoundPlan


class FedReb(BaseStrategy):
    def validate_metrics(self, metrics: dict[str, Scalar]) -> str | None:
        n_eff = metrics.get("n-eff")
        if isinstance(n_eff, bool) or not isinstance(n_eff, int) or n_eff <= 0:
            return f"n-eff={n_eff!r} must be an integer > 0"
        return None

    def aggregate(self, plan: RoundPlan, uploads: list[Upload]) -> list[np.ndarray]:
        # ablations, seed 001 section 4.5 (issue 16 item 5): a origin (Eq 8), d split, and
        # b: origin (one complete base + head); c: split, H1 by n_eff of D_o, i.e. n_orig
        origin = self.algo.aggregation == "origin" or self.algo.ablation in ("a", "b")
        if origin:
            return super().aggregate(plan, uploads)
        is_base = [name.startswith("base.") for name in self.array_names]
        return split_average([u.arrays for u in uploads], is_base,
                             [u.num_examples for u in uploads],
                             [int(u.metrics["n-eff"]) for u in uploads])
