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
