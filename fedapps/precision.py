"""Training precision (`train.precision`): FedAIoT's quantized training (seed 004 section 2.2.5,
Table 2.6; our decisions for its ambiguity B11 are in docs/ARCHITECTURE.md, "Precision").

Why one object: the client's training loop, its evaluation and the memory command must apply
the same arithmetic, and the default `fp32` must leave every operation exactly as it was (no
casts, no autocast), so that existing numbers do not move.

- fp32: nothing changes.
- fp16 / bf16: pure half training, as the reference's `--precision float16` (`model.half()`):
  parameters, gradients, optimizer state, inputs and regression targets in float16 (bfloat16).
  BatchNorm layers stay float32, as the reference keeps them (torch's batch norm takes half
  inputs with float32 parameters and returns half).
- amp: torch.autocast with float32 master weights; float16 with a GradScaler where this torch's
  autocast computes float16 on the device (CUDA; CPU too in recent torch), else bfloat16 without
  a scaler (older torch's CPU autocast knows only bfloat16).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from fedapps.errors import ConfigError

PRECISIONS = ("fp32", "fp16", "amp", "bf16")
HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_NORMS = (nn.modules.batchnorm._BatchNorm,)  # kept float32 in half training (the reference)

Predict = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@lru_cache(maxsize=4)
def amp_dtype(device_type: str) -> torch.dtype:
    """float16 where torch's autocast computes float16 on this device type, else bfloat16.
    Probed (a 2x2 matmul) rather than looked up: CPU autocast gained float16 in torch 2.x, and
    an unsupported dtype only warns and disables autocast."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autocast(device_type, dtype=torch.float16):
                ones = torch.ones(2, 2, device=device_type)
                out = ones @ ones
    except RuntimeError:
        return torch.bfloat16
    return torch.float16 if out.dtype == torch.float16 else torch.bfloat16


def check_supported(precision: str, device: torch.device | str) -> None:
    """A one-line ConfigError for a precision this device cannot train in."""
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision={precision!r}: allowed: {', '.join(PRECISIONS)}")
    dev = torch.device(device)
    if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("train.precision='bf16': this GPU has no bfloat16 support "
                          "(torch.cuda.is_bf16_supported() is False); use fp16, amp or fp32")


class Precision:
    """How a client computes: the parameter dtype while it trains and evaluates, autocast,
    loss scaling and input casts. `Precision("fp32", ...)` is the identity everywhere."""

    def __init__(self, name: str = "fp32", device: torch.device | str = "cpu") -> None:
        check_supported(name, device)
        self.name = name
        self.device_type = torch.device(device).type
        self.dtype = HALF_DTYPES.get(name, torch.float32)  # parameters while training
        self.autocast_dtype = amp_dtype(self.device_type) if name == "amp" else None

    @property
    def casts_modules(self) -> bool:
        """fp16 / bf16: the modules themselves are cast (pure half training)."""
        return self.dtype != torch.float32

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's context: torch.autocast for amp, nothing otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def grad_scaler(self, state: Mapping[str, Any] | None = None) -> torch.amp.GradScaler | None:
        """amp in float16 (bfloat16 has float32's range: none): the loss scaler of one local
        training, resumed from `state` (a GradScaler.state_dict() the node kept, as the
        reference keeps one scaler per trainer) so that a client does not skip steps to find
        the scale again every round; a fresh one skips its first steps (inf gradients)."""
        if self.autocast_dtype != torch.float16:
            return None
        scaler = torch.amp.GradScaler(self.device_type)
        if state:
            scaler.load_state_dict(dict(state))
        return scaler

    def after_step(self) -> None:
        """amp: the weights just changed, so drop autocast's cached half copies of them. The
        cache lives until the outermost autocast region ends, so training inside an enclosing
        one (an evaluation that fine-tunes first, FedBABU) would otherwise use stale weights."""
        if self.autocast_dtype is not None:
            torch.clear_autocast_cache()

    def inputs(self, t: torch.Tensor) -> torch.Tensor:
        """A floating tensor (inputs, regression targets) in the half dtype; labels and the
        fp32 / amp cases unchanged (the same tensor)."""
        if self.casts_modules and t.is_floating_point():
            return t.to(self.dtype)
        return t

    def cast(self, modules: Iterable[nn.Module]) -> None:
        """Modules to the half dtype, BatchNorm layers kept float32 (in place: parameters
        keep their identity, so optimizers built before still hold them)."""
        for module in modules:
            module.to(self.dtype)
            for sub in module.modules():
                if isinstance(sub, _NORMS):
                    sub.float()

    @staticmethod
    def restore(modules: Iterable[nn.Module]) -> None:
        """Modules back to float32: the half values, exactly (every half value is a float32)."""
        for module in modules:
            module.float()

    def predict(self, predict: Predict) -> Predict:
        """An evaluation's `predict` run in this precision (inputs cast, autocast), its outputs
        as float32 so that losses and metric sums are summed in float32; fp32: `predict`."""
        if self.name == "fp32":
            return predict

        def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            with self.autocast():
                out_g, out_p = predict(self.inputs(x))
            return out_g.float(), out_p.float()

        return run

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """A layer without a half kernel on this device surfaces as one clear line."""
        try:
            yield
        except RuntimeError as err:
            text = str(err)
            if self.name != "fp32" and "not implemented for" in text and (
                    "Half" in text or "BFloat16" in text):
                raise ConfigError(f"train.precision={self.name!r}: an operation of this model "
                                  f"has no {self.name} kernel on {self.device_type} "
                                  f"({text.splitlines()[0]}); use amp or fp32") from None
            raise
