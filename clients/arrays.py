"""Moving model state between torch modules and the NumPy arrays Flower carries."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

HALF = (torch.float16, torch.bfloat16)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array of its own; half entries (a model trained in fp16 / bf16,
    fedapps/precision.py) as float32, which holds them exactly and which NumPy has for
    bfloat16 too, so what is exchanged or kept stays float32."""
    t = t.detach().cpu()
    return (t.float() if t.dtype in HALF else t).numpy().copy()


def get_arrays(model: nn.Module, prefix: str = "") -> list[np.ndarray]:
    """State entries whose names start with `prefix`, as NumPy arrays in state_dict order."""
    return [to_numpy(v) for k, v in model.state_dict().items() if k.startswith(prefix)]


def set_arrays(model: nn.Module, arrays: list[np.ndarray], prefix: str = "") -> None:
    """Load arrays into the state entries whose names start with `prefix`, in order."""
    keys = [k for k in model.state_dict() if k.startswith(prefix)]
    if len(keys) != len(arrays):
        raise ValueError(f"expected {len(keys)} arrays for '{prefix}*', got {len(arrays)}")
    state = {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)}
    model.load_state_dict(state, strict=not prefix)


def get_named(model: nn.Module, keys: list[str]) -> list[np.ndarray]:
    """The state entries named in `keys`, in that order, as NumPy arrays."""
    state = model.state_dict()
    return [to_numpy(state[k]) for k in keys]


def set_named(model: nn.Module, keys: list[str], arrays: list[np.ndarray]) -> None:
    """Load arrays into the state entries named in `keys` (the others stay as they are)."""
    if len(keys) != len(arrays):
        raise ValueError(f"expected {len(keys)} arrays, got {len(arrays)}")
    model.load_state_dict({k: torch.from_numpy(np.asarray(a))
                           for k, a in zip(keys, arrays, strict=True)}, strict=False)


def momentum_arrays(optimizer: torch.optim.Optimizer) -> list[np.ndarray]:
    """An SGD optimizer's state as arrays: one momentum buffer per parameter, in
    param_groups order, size 0 where SGD holds none (no step yet, frozen); [] when none has
    one (momentum 0 keeps no state). What a client keeps between participations and the
    centralized runner checkpoints."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    bufs = [optimizer.state.get(p, {}).get("momentum_buffer") for p in params]
    if all(b is None for b in bufs):
        return []
    return [np.zeros(0, np.float32) if b is None else to_numpy(b) for b in bufs]


def load_momentum(optimizer: torch.optim.Optimizer, arrays: list[np.ndarray]) -> None:
    """Put buffers from `momentum_arrays` back, each in its parameter's device and dtype (the
    precision it trains in); the learning rate stays the new optimizer's (this round's)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if arrays and len(arrays) != len(params):
        raise ValueError(f"optimizer state holds {len(arrays)} momentum buffers for "
                         f"{len(params)} parameters")
    for p, buf in zip(params, arrays, strict=False):
        if buf.size:
            if tuple(buf.shape) != tuple(p.shape):
                raise ValueError(f"momentum buffer of shape {tuple(buf.shape)} for a parameter "
                                 f"of shape {tuple(p.shape)}")
            optimizer.state[p]["momentum_buffer"] = torch.from_numpy(np.asarray(buf)).to(
                p.device, p.dtype)
