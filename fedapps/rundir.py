"""Run directories: one process writes a run directory at a time, every run has an identity,
and a resume may change only what does not change the experiment.

`claim(run_dir, mode)` takes an exclusive `fcntl.flock` on `<run_dir>/.lock` for the lifetime
of the launcher: the OS drops it when the process ends, so a crashed or SIGKILLed run never
leaves a directory stuck. Under the lock it decides what happens to a run already there (refuse,
replace, keep) and yields the run id: a fresh random id for a new run, the stored one for a
resume. The id travels in the Flower run config (`run-id`); clients key their state on disk by
it (fedapps/client_app.py) and the ServerApp writes only while `<run_dir>/run-id` still names
it, so a fresh run never reads or overwrites another run's state.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedapps.errors import ConfigError

LOCK = ".lock"
RUN_ID = "run-id"
CLIENT_STATE = ".client-state"  # simulation clients' state: <output-dir>/.client-state/<run>/

# What a new run may do with a directory that already holds a run.
NEW = "new"  # refuse a completed or resumable one (the default of `fedapps run`/`deploy-local`)
OVERWRITE = "overwrite"  # replace it (`--overwrite`)
RESUME = "resume"  # continue it with its run id (`fedapps resume`)
REDO_UNFINISHED = "redo-unfinished"  # replace an unfinished run, keep a completed one
RESUME_UNFINISHED = "resume-unfinished"  # continue an unfinished run, keep a completed one (grids)
MODES = (NEW, OVERWRITE, RESUME, REDO_UNFINISHED, RESUME_UNFINISHED)

# The files and folders a run writes: what --overwrite removes (nothing else is touched).
RUN_FILES = ("results.json", "metrics.csv", "config.yaml", "checkpoint.npz", RUN_ID,
             "confusion.csv", "confusion-counts.csv")  # the last two: `fedapps centralized`
RUN_FOLDERS = ("node-state", "wandb", "logs")  # logs: deploy-local's processes

# Config keys a resume may change: they neither change the model, the data nor the training,
# only how long the run goes on, how long it waits and what it reports (README, "Run
# directories, stopping and resuming").
RESUMABLE = ("rounds", "output.plots", "federation.round-timeout", "wandb.*")

_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RunDirBusy(ConfigError):
    """Another live process holds the run directory."""


class RunDirTaken(ConfigError):
    """The directory holds a run that this mode may not replace."""


class RunCompleted(RunDirTaken):
    """REDO_UNFINISHED or RESUME_UNFINISHED found a completed run (another process finished it
    meanwhile)."""


def client_state_root(run_dir: Path) -> Path:
    """Where `fedapps run` keeps its simulated clients' state (outside the run directory, so
    the results folder holds results only)."""
    return run_dir.parent / CLIENT_STATE


def run_status(run_dir: Path) -> str | None:
    """`summary.status` of the run's results.json; None without a readable one."""
    try:
        return str(json.loads((run_dir / "results.json").read_text())["summary"]["status"])
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def read_run_id(run_dir: Path) -> str | None:
    try:
        return (run_dir / RUN_ID).read_text().strip() or None
    except OSError:
        return None


def check_run_id(run_id: str) -> str:
    """A run id is a path component of client state: letters, digits, '-' and '_' only."""
    if not _ID.fullmatch(run_id):
        raise ConfigError(f"run-id={run_id!r}: only letters, digits, '-' and '_' (1-64)")
    return run_id


def check_owner(run_dir: Path, run_id: str | None) -> None:
    """Raise unless `run_dir` still belongs to `run_id` (None: nothing to check). A server
    whose launcher died must not write over the run that claimed the directory after it."""
    if run_id is None:
        return
    owner = read_run_id(run_dir)
    if owner != run_id:
        raise RuntimeError(f"{run_dir} now belongs to run {owner}, not to this run {run_id}: "
                           "stopping without writing")


def _holds_run(run_dir: Path, status: str | None) -> bool:
    """Something a new run would destroy: a completed run, or one that can be resumed (a run
    that stopped before its first checkpoint has nothing to keep)."""
    return status == "completed" or (run_dir / "checkpoint.npz").is_file()


def clear(run_dir: Path) -> None:
    """Remove what a run wrote (RUN_FILES, plots, RUN_FOLDERS, temporary files) and its
    simulated clients' state; the lock and any other file stay. A directory without a run id
    or results is not a run's: only the clients' state is removed there."""
    shutil.rmtree(client_state_root(run_dir) / run_dir.name, ignore_errors=True)
    if not any((run_dir / name).is_file() for name in (RUN_ID, "results.json")):
        return
    for path in run_dir.iterdir():
        temporary = path.name.startswith(".") and ".tmp" in path.name
        if path.name in RUN_FILES or path.suffix == ".png" or temporary:
            path.unlink(missing_ok=True)
        elif path.name in RUN_FOLDERS and path.is_dir():
            shutil.rmtree(path)


def _prepare(run_dir: Path, mode: str) -> str:
    """Under the lock: apply `mode` to what is there; the run id to use."""
    status = run_status(run_dir)
    if mode in (REDO_UNFINISHED, RESUME_UNFINISHED) and status == "completed":
        raise RunCompleted(f"{run_dir}: completed meanwhile")
    if mode in (RESUME, RESUME_UNFINISHED):
        run_id = read_run_id(run_dir)
        if run_id is None:
            raise ConfigError(f"{run_dir}: no {RUN_ID} file (a run from before run ids): its "
                              "client state cannot be matched; start it again with --overwrite")
        return check_run_id(run_id)
    if mode == NEW and status == "completed":
        raise RunDirTaken(f"{run_dir}: holds a completed run; add --overwrite to replace it, "
                          "or choose another --set output.run-name=...")
    if mode == NEW and _holds_run(run_dir, status):
        raise RunDirTaken(f"{run_dir}: holds an unfinished run; `fedapps resume {run_dir}` "
                          "continues it, --overwrite starts it again")
    clear(run_dir)  # whatever an earlier run left (a run id, a first round's partial results)
    run_id = uuid.uuid4().hex[:16]
    tmp = run_dir / f".{RUN_ID}.{os.getpid()}.tmp"
    tmp.write_text(run_id + "\n")
    tmp.replace(run_dir / RUN_ID)
    return run_id


@contextmanager
def claim(run_dir: Path, mode: str = NEW) -> Iterator[str]:
    """Hold `run_dir` exclusively while the block runs; yields the run id (see the module
    docstring). A second claim, from any process, fails at once with RunDirBusy."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(f"{run_dir}: cannot create the run directory ({err.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunDirBusy(f"{run_dir}: in use by another fedapps process (pid {holder}); "
                             "wait for it to end, or choose another --set output.run-name=...") \
                from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield _prepare(run_dir, mode)
    finally:
        os.close(fd)  # releases the lock


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def _resumable(key: str, allowed: tuple[str, ...] = RESUMABLE) -> bool:
    return any(key == k or (k.endswith(".*") and key.startswith(k[:-1])) for k in allowed)


def check_resume_changes(before: Mapping[str, Any], after: Mapping[str, Any],
                         allowed: tuple[str, ...] = RESUMABLE) -> None:
    """One ConfigError naming every key a resume would change outside `allowed` (a
    federation's RESUMABLE; the centralized baseline's own list)."""
    old, new = _flatten(before), _flatten(after)
    changed = sorted(k for k in old.keys() | new.keys()
                     if old.get(k) != new.get(k) and not _resumable(k, allowed))
    if changed:
        shown = ", ".join(f"{k}={new.get(k)!r}" for k in changed)
        raise ConfigError(f"resume: {shown} would change the experiment; a resume may change "
                          f"only {', '.join(allowed)} (start a new run for anything else)")
