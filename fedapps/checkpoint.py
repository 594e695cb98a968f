"""Server checkpoints: after every round, the global arrays, the round and the strategy's own
state in one .npz (written atomically, read with allow_pickle=False)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

FILE = "checkpoint.npz"


def save(run_dir: Path, completed_round: int, global_arrays: list[np.ndarray],
         state: dict[str, list[np.ndarray]]) -> Path:
    arrays = {f"global_{i}": a for i, a in enumerate(global_arrays)}
    for name, values in state.items():
        arrays.update({f"state__{name}__{i}": a for i, a in enumerate(values)})
    path = run_dir / FILE
    tmp = run_dir / f".{FILE}.{os.getpid()}.tmp.npz"
    np.savez(tmp, round=np.array(completed_round), **arrays)
    tmp.replace(path)
    return path


def load(run_dir: Path) -> tuple[int, list[np.ndarray], dict[str, list[np.ndarray]]] | None:
    """(completed round, global arrays, strategy state), or None without a checkpoint."""
    path = run_dir / FILE
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        n_global = sum(1 for k in z.files if k.startswith("global_"))
        global_arrays = [z[f"global_{i}"] for i in range(n_global)]
        state: dict[str, list[np.ndarray]] = {}
        for key in sorted(z.files, key=lambda k: (k.rsplit("__", 1)[0], int(k.rsplit("__", 1)[-1])
                                                  if k.startswith("state__") else 0)):
            if key.startswith("state__"):
                _, name, _ = key.split("__")
                state.setdefault(name, []).append(z[key])
        return int(z["round"]), global_arrays, state
