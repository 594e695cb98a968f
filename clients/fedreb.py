"""FedReb / FedReG client (seed 000 Algorithm 2, seed 001 section 3, DECISIONS).

The model's `head` is H1, the global head; H2 is a personal head of the same shape that never
leaves the client. Per local epoch:
- stage 1 on the original data D_o: CE(H1(z) + H2(z)), updating base and H2 (H1 is not stepped,
  though gradients flow through it);
- stage 2 on the rebalanced data D_r: CE(H1(z)), updating base and H1.
Each stage has its own SGD optimizer, so no momentum leaks between stages; with
train.optimizer-state persist both (opt_1, opt_2) keep their momentum across participations, as
the thesis creates them once per client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn import functional as F

from clients.base import LocalData
from clients.personal import PersonalHeadClient
from fedapps.data.rebalance import AUGMENTATIONS, SCOPES, THRESHOLDS
from fedapps.settings import AlgoSettings, setting


@dataclass(frozen=True)
class FedRebSettings(AlgoSettings):
    """FedReb's defaults (seed 000); conf/algorithm/fedreg.yaml presets scope: global. The
    first three also parametrize the `rebalance` data transform (fedapps/data/rebalance.py)."""

    scope: str = setting("client", choices=SCOPES)  # client (FedReb) | global (FedReG)
    threshold: str = setting("mean", choices=THRESHOLDS)
    augmentation: str = setting("simple", choices=AUGMENTATIONS)  # simple (5-step) | auto
    stage_order: str = setting("interleaved", choices=("interleaved", "sequential"))
    aggregation: str = setting("split", choices=("split", "origin"))  # base by n_orig, H1 n_eff
    # seed 001 Table 5: a origin weights, b one head on D_o then D_r, c stage 2 on D_o, d no
    # stage 1 (weights: strategies/fedreb.py; b and d predict with H1 alone)
    ablation: str = setting("none", choices=("none", "a", "b", "c", "d"))


class RebalancedData(LocalData, Protocol):
    """Local data plus the client's rebalanced set."""

    x_reb: torch.Tensor
    y_reb: torch.Tensor
    n_eff: int


class FedRebClient(PersonalHeadClient):
    """Base + H1 (the model's head, aggregated) + H2 (`self.personal`, kept on the client);
    uploads base + H1 with n_orig and n_eff. A never-selected client uses its initial H2."""

    state_key = "fedreb-h2"
    algo: FedRebSettings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ablation = self.algo.ablation
        self.stage_order = self.algo.stage_order

    # ---- the two stages ------------------------------------------------------------------
    def stage1(self, optimizer: torch.optim.Optimizer, epochs: int = 1) -> float:
        """CE(H1 + H2) on D_o; the optimizer holds base + H2 only (ablation b: base + H1)."""
        base, h1, h2 = self.model.base, self.model.head, self.personal
        if self.ablation == "b":  # no extra head: one head, trained on D_o then on D_r
            return self.sgd_epochs([], self.task_loss(self.model), epochs, optimizer=optimizer)

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = base(x)
            return F.cross_entropy(h1(z) + h2(z), y)

        return self.sgd_epochs([], loss, epochs, optimizer=optimizer)

    def stage2(self, optimizer: torch.optim.Optimizer, epochs: int = 1) -> float:
        """CE(H1) on D_r (ablation c: on D_o); the optimizer holds base + H1."""
        data: RebalancedData = self.data  # type: ignore[assignment]
        x, y = (None, None) if self.ablation == "c" else (data.x_reb, data.y_reb)
        return self.sgd_epochs([], self.task_loss(self.model), epochs, x=x, y=y,
                               optimizer=optimizer)

    def local_train(self, config: dict[str, Any]) -> dict[str, Any]:
        s = self.settings
        self.personal.train()
        sgd = self.sgd
        base = list(self.model.base.parameters())
        h1 = list(self.model.head.parameters())
        opt1 = sgd(base + (h1 if self.ablation == "b" else list(self.personal.parameters())),
                   keep="stage1")
        opt2 = sgd(base + h1, keep="stage2")
        with_stage1 = self.ablation != "d"
        losses = {"stage1-loss": 0.0, "stage2-loss": 0.0}
        if self.stage_order == "sequential":
            if with_stage1:
                losses["stage1-loss"] = self.stage1(opt1, s.local_epochs)
            losses["stage2-loss"] = self.stage2(opt2, s.local_epochs)
        else:
            for _ in range(s.local_epochs):
                if with_stage1:
                    losses["stage1-loss"] = self.stage1(opt1)
                losses["stage2-loss"] = self.stage2(opt2)
        self.model.zero_grad(set_to_none=True)  # H1 collected gradients in stage 1: drop them
        self.save_personal()
        return {**losses, "n-eff": self.effective_samples()}

    def effective_samples(self) -> int:
        """n_eff of the set H1 trained on in stage 2, which weights H1 on the server."""
        if self.ablation == "c":  # D_o, not rebalanced: every sample is an original (seed 000
            return len(self.data.y_train)  # eq. 3.4), so n_eff = n_orig (issue 16 item 5)
        return int(self.data.n_eff)  # type: ignore[attr-defined]

    def predict(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """G: H1(z). P: argmax over H1(z) + H2(z) (seed 000 section 2); ablation b has no H2
        and d's H2 never trains (no stage 1), so both predict P with H1 alone (issue 16 item 5)."""
        z = self.model.base(x)
        g = self.model.head(z)
        if self.ablation in ("b", "d"):
            return g, g
        return g, g + self.personal(z)
