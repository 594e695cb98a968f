"""torch.optim.SGD without its hooks for torch.compile, which cost an edge node 70 MB.

Every torch optimizer imports `torch._dynamo` (the compiler front end, with SymPy: about 70 MB
resident on a CPU-only torch, docs/PERFORMANCE.md "A lean node") the first time it is used:
`Optimizer.add_param_group` and `zero_grad` are wrapped by `torch._disable_dynamo`, whose wrapper
imports it on the first call, and `step` by `_use_grad_for_differentiable`, which calls
`torch._dynamo.graph_break()` on every step. Both only matter while torch.compile traces the
optimizer; this project trains eagerly. `EagerSGD` calls the same undecorated methods (the
decorators keep them as `__wrapped__`), so its arithmetic is torch's SGD's (tests/
test_optim.py checks it bit for bit). Should a later torch drop `__wrapped__`, the decorated
method runs: the memory comes back, nothing breaks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import SGD, Optimizer


def _undecorated(method: Callable) -> Callable:
    return getattr(method, "__wrapped__", method)


class EagerSGD(SGD):
    """SGD (momentum, weight decay, parameter groups, step hooks) that never imports the
    torch.compile machinery."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _undecorated(Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _undecorated(Optimizer.zero_grad)(self, set_to_none)

    @torch.no_grad()  # what the step decorator does when the optimizer is not differentiable
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        return _undecorated(SGD.step)(self, closure)
