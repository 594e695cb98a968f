"""Forward-pass FLOPs of a model for one input, counted by hooks (multiply-adds x 2).

Seed 004 Table 3.6's "FLOPs" are multiply-accumulates of all layers (PreResNet18: 557.656 M);
our count is 2 x the multiply-accumulates of the convolutions and linear layers (1110.8 M,
i.e. 555.4 M MACs, 0.4% below the paper's total that also counts normalization)."""

from __future__ import annotations

import torch
from torch import nn


def forward_flops(model: nn.Module, sample_shape: tuple[int, ...]) -> int:
    """FLOPs of Conv2d and Linear layers for one sample (other layers are ignored)."""
    total = 0

    def conv(m: nn.Conv2d, _inp: tuple, out: torch.Tensor) -> None:
        nonlocal total
        k = m.kernel_size[0] * m.kernel_size[1] * m.in_channels // m.groups
        total += 2 * out.numel() * k

    def linear(m: nn.Linear, _inp: tuple, out: torch.Tensor) -> None:
        nonlocal total
        total += 2 * out.numel() * m.in_features

    hooks = [m.register_forward_hook(conv if isinstance(m, nn.Conv2d) else linear)
             for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        first = next(model.parameters())  # the probe in the model's dtype (fp16 training)
        model(torch.zeros(1, *sample_shape, dtype=first.dtype, device=first.device))
    model.train(was_training)
    for h in hooks:
        h.remove()
    return total
