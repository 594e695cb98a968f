"""A client's personal state on disk, safe across a crash in the middle of a round.

Each file records the (round, step) of the instruction that wrote it, and the generation
before it is kept beside it (`<name>.prev.npz`). A run killed after its checkpoint of round R
but while round R+1 was training leaves some clients with state written in R+1, a round the
server never aggregated. The resume redoes R+1, and every instruction after the resume names
R (strategies/plan.py RESUMED_ROUND, RESUMED_STEP): a generation written after that point is
ignored and the one before it is read, so the redone round starts from the state it started
from the first time (tests/test_state_files.py; tests/test_reproduce.py on a real grid
run).
Files written before the clock existed count as written at (0, 0).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from strategies.plan import WHOLE_ROUND

Clock = tuple[int, int]  # (round, step within the round, from 0)

CLOCK = "written_at"  # the array in each file that holds its clock


def still_valid(written: Clock, resumed_after: Clock | None) -> bool:
    """Whether state written at `written` belongs to the run the server resumed (None: not
    resumed, every generation does). `resumed_after` is the checkpoint's (round, last
    completed step), step WHOLE_ROUND for a complete round."""
    if resumed_after is None:
        return True
    r, s = resumed_after
    return written[0] < r or (written[0] == r and (s == WHOLE_ROUND or written[1] <= s))


def _paths(folder: Path, name: str) -> tuple[Path, Path]:
    return folder / f"{name}.npz", folder / f"{name}.prev.npz"


def _clock(z: np.lib.npyio.NpzFile) -> Clock:
    return (int(z[CLOCK][0]), int(z[CLOCK][1])) if CLOCK in z.files else (0, 0)


def _read(path: Path) -> tuple[Clock, list[np.ndarray]] | None:
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        arrays = [z[f"arr_{i}"] for i in range(len(z.files) - (CLOCK in z.files))]
        return _clock(z), arrays


def written_at(path: Path) -> Clock | None:
    """The (round, step) that wrote a state file; None when there is no file."""
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:  # reads the clock member only
        return _clock(z)


def save(folder: Path, name: str, arrays: list[np.ndarray], clock: Clock,
         resumed_after: Clock | None = None) -> None:
    """Write `name` as of `clock` (atomic). A valid generation from an earlier instruction
    becomes the previous one; an invalid one (written in a round the resume redoes) is
    replaced, so the previous generation stays the last valid state."""
    folder.mkdir(parents=True, exist_ok=True)
    current, previous = _paths(folder, name)
    written = written_at(current)
    if written is not None and written < clock and still_valid(written, resumed_after):
        current.replace(previous)
    tmp = folder / f".{name}.{os.getpid()}.tmp.npz"
    np.savez(tmp, *arrays, **{CLOCK: np.asarray(clock, dtype=np.int64)})
    tmp.replace(current)


def load(folder: Path, name: str, resumed_after: Clock | None = None
         ) -> list[np.ndarray] | None:
    """The newest valid generation of `name`, or None when there is none."""
    for path in _paths(folder, name):
        found = _read(path)
        if found is not None and still_valid(found[0], resumed_after):
            return found[1]
    return None
