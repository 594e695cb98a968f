"""At most N ClientApp tasks computing at once among the SuperNodes of one machine.

`fedapps deploy-local` runs every SuperNode on the machine it runs on. When a round's training
clients outnumber its cores, their processes share the cores by time slices, and each fit then
costs more CPU than with fewer at once: with 5 training nodes on 2 cores a fit's task took
5.50-6.14 CPU seconds (median) where two at a time took 4.57-5.01 (docs/PERFORMANCE.md, "Compute
slots"). A Flower simulation never does this: Ray runs as many clients at once as the cores
allow and queues the rest. So deploy-local's warm ClientApps take one of N slots (default: the
machine's cores) for the duration of a task and wait for one when all are taken; a slot is an
exclusive `flock` on one of N files in a folder the nodes share, which the kernel releases when
its holder exits, so a crashed node never keeps one. Devices that each run their own node need
none of this. Stdlib only: the warm ClientApp imports it before any app code
(fedapps/warm_clientapp.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

COUNT_VARIABLE, FOLDER_VARIABLE = "FEDAPPS_COMPUTE_SLOTS", "FEDAPPS_COMPUTE_SLOT_DIR"
# A task waiting for a slot looks again this often (a task takes seconds; each look is one
# non-blocking flock per slot).
RETRY_SECONDS = 0.005


def machine_cores() -> int:
    """The cores this process may run on (its affinity; os.cpu_count where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def environment(folder: Path, count: int) -> dict[str, str]:
    """The variables that give every node started with them `count` slots in `folder`."""
    slots = ComputeSlots(folder, count)  # refuses a count below 1
    return {COUNT_VARIABLE: str(slots.count), FOLDER_VARIABLE: str(slots.folder)}


class ComputeSlots:
    """N slots in `folder` (made if missing), shared by every process that names the same."""

    def __init__(self, folder: Path, count: int,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if count < 1:
            raise ValueError(f"compute slots: {count}, must be at least 1")
        self.folder, self.count, self.sleep = Path(folder), count, sleep

    @contextlib.contextmanager
    def held(self) -> Iterator[int]:
        """Take a free slot for the `with` block, waiting while all are taken; yields its
        number."""
        import fcntl

        self.folder.mkdir(parents=True, exist_ok=True)
        files = [os.open(self.folder / f"slot-{i}", os.O_CREAT | os.O_RDWR, 0o600)
                 for i in range(self.count)]
        try:
            while True:
                for number, fd in enumerate(files):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    try:
                        yield number
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    return
                self.sleep(RETRY_SECONDS)
        finally:
            for fd in files:
                os.close(fd)


def from_environment(env: Mapping[str, str] = os.environ) -> ComputeSlots | None:
    """The slots this process's environment names (`environment`), None if it names none."""
    count, folder = env.get(COUNT_VARIABLE), env.get(FOLDER_VARIABLE)
    if not count or not folder:
        return None
    if not count.isdigit():
        raise ValueError(f"{COUNT_VARIABLE}={count!r}: must be a whole number of slots, "
                         "at least 1")
    return ComputeSlots(Path(folder), int(count))


def held_slot(slots: ComputeSlots | None) -> contextlib.AbstractContextManager:
    """A slot of `slots` for a `with` block, or nothing to wait for without slots."""
    return contextlib.nullcontext() if slots is None else slots.held()
