"""Server checkpoints: after every step, the global arrays, where the run stands (round and,
inside a multi-step round, the last completed step with the open round's counters) and the
strategy's own state, in one .npz written atomically and read with allow_pickle=False."""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedapps.errors import ConfigError
from fedapps.rundir import check_owner

FILE = "checkpoint.npz"


@dataclass
class Snapshot:
    """Where a run stands. `step` is None when `round` is complete; otherwise the last
    completed step (from 0) of the open round, whose counters are in `open_round` (JSON)."""

    round: int
    global_arrays: list[np.ndarray]
    state: dict[str, list[np.ndarray]] = field(default_factory=dict)
    step: int | None = None
    open_round: str | None = None

    @property
    def completed_rounds(self) -> int:
        return self.round if self.step is None else self.round - 1


def save(run_dir: Path, snap: Snapshot, run_id: str | None = None) -> Path:
    """Write the snapshot; with `run_id`, only while the directory still belongs to that run
    (fedapps/rundir.py)."""
    check_owner(run_dir, run_id)
    arrays = {f"global_{i}": a for i, a in enumerate(snap.global_arrays)}
    for name, values in snap.state.items():
        if "__" in name:
            raise ValueError(f"state name {name!r} must not contain '__'")
        arrays.update({f"state__{name}__{i}": a for i, a in enumerate(values)})
    path = run_dir / FILE
    tmp = run_dir / f".{FILE}.{os.getpid()}.tmp.npz"
    np.savez(tmp, round=np.array(snap.round),
             step=np.array(-1 if snap.step is None else snap.step),
             open_round=np.array(snap.open_round or ""), **arrays)
    tmp.replace(path)
    return path


def load(run_dir: Path) -> Snapshot | None:
    """The saved snapshot, or None without a checkpoint (files from before steps existed
    have no `step`: their round is complete). A truncated or damaged file is a one-line
    ConfigError naming it (the CLI checks this before a resume starts any process)."""
    path = run_dir / FILE
    if not path.is_file():
        return None
    try:
        return _read(path)
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile) as err:
        reason = " ".join(str(err).split())  # one line, whatever the library wrote
        raise ConfigError(f"{path}: not a readable checkpoint ({type(err).__name__}: {reason});"
                          " it cannot be resumed") from None


def _read(path: Path) -> Snapshot:
    with np.load(path, allow_pickle=False) as z:
        n_global = sum(1 for k in z.files if k.startswith("global_"))
        global_arrays = [z[f"global_{i}"] for i in range(n_global)]
        keys = sorted((k for k in z.files if k.startswith("state__")),
                      key=lambda k: (k.split("__")[1], int(k.split("__")[2])))
        state: dict[str, list[np.ndarray]] = {}
        for key in keys:
            state.setdefault(key.split("__")[1], []).append(z[key])
        step = int(z["step"]) if "step" in z.files else -1
        open_round = str(z["open_round"]) if "open_round" in z.files else ""
        return Snapshot(int(z["round"]), global_arrays, state, None if step < 0 else step,
                        open_round or None)
