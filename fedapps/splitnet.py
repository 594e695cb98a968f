"""The split every model of the project has: `base` (shared feature extractor) and `head` (the
last FC layers), the contract personalized algorithms and head depths rely on."""

from __future__ import annotations

import torch
from torch import nn


class SplitNet(nn.Module):
    """forward(x) = head(base(x)); state_dict keys start with 'base.' or 'head.'."""

    def __init__(self, base: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.base = base
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.base(x))


def layered(features: nn.Module, fc_blocks: list[nn.Module], head_depth: int) -> SplitNet:
    """A SplitNet from hand-written FC blocks (each an FC layer with what follows it): the last
    `head_depth` blocks form the head. For models whose FC stack is not plain Linear-ReLU."""
    if not 1 <= head_depth <= len(fc_blocks):
        raise ValueError(f"head depth {head_depth} outside 1..{len(fc_blocks)}")
    cut = len(fc_blocks) - head_depth
    return SplitNet(nn.Sequential(features, nn.Flatten(), *fc_blocks[:cut]),
                    nn.Sequential(*fc_blocks[cut:]))
