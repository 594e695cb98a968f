"""Process trees the launcher starts: find them, stop them, and make them die with it.

A SIGKILLed launcher runs no cleanup code, and what it started (the SuperLink, SuperNodes, each
SuperLink's executors and Ray's services, most in sessions of their own) would
run on; the SuperLink would even finish the run. So the launcher starts one watchdog process
(this file run as a script, standard library only) that holds the read end of a pipe, and
registers every child it starts (`watch`). However the launcher ends, the kernel closes the
write end: the watchdog reads EOF and stops the process tree of every child still registered.

A tree is more than /proc's parent links show: a process started just as its parent is stopped
(Ray's raylet starts its dashboard and runtime-env agents in the seconds after Ray comes up) is
reparented to init when the parent dies, and no descendant sweep finds it again. So each child
is started with a random mark in its environment (`start_watched`), which everything below it
inherits; stopping a tree also stops every live process that carries its mark.

A pipe rather than Linux's PR_SET_PDEATHSIG: the death signal follows the *thread* that forked
the child, and children are started from worker threads (`reproduce --jobs`, fault tests that
restart nodes), which would kill them when that thread ends. Process start times guard against
a pid reused after the child exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def child_map() -> dict[int, list[int]]:
    """Parent pid -> child pids of every live process (one pass over /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return children


def descendants(pid: int) -> list[int]:
    """All live descendants of a process (Linux /proc; empty elsewhere)."""
    children = child_map()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name (so field 3, the state, is [0]); [] once the
    process is gone (or off Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def status_kb(field: str, pid: int | str = "self") -> int | None:
    """A field of /proc/<pid>/status in kB (VmRSS, VmHWM, ...); None where it is not there."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def command_line(pid: int) -> str:
    """The process's command line with spaces between arguments; '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its reaper."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] != "Z"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with
    the pid, the identity of one process."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (stat fields 14-15); 0 once gone."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def terminate(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                continue
        if not alive or sig == signal.SIGKILL:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(running(p) for p in alive):
            time.sleep(0.1)
        pids = alive


MARK_VAR = "FEDAPPS_TREE_MARKS"


def marked_env(env: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """A copy of `env` (default: this process's) with a new random mark appended to MARK_VAR,
    which stays the last variable: processes that rewrite their title (Ray's, setproctitle)
    overwrite the start of their environment block, not its end. Marks add up, so a tree
    inside a marked tree carries both."""
    env = dict(os.environ if env is None else env)
    mark = uuid.uuid4().hex
    env[MARK_VAR] = f"{env.pop(MARK_VAR, '')} {mark}".strip()
    return env, mark


def marked(marks: Iterable[str]) -> list[int]:
    """Live processes (this one excepted) whose environment carries one of `marks`."""
    wanted = [m.encode() for m in marks if m]
    found: list[int] = []
    if not wanted:
        return found
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        try:
            blob = environ.read_bytes()
        except OSError:  # gone, or another user's
            continue
        if pid != os.getpid() and any(m in blob for m in wanted) and running(pid):
            found.append(pid)
    return found


def stop_trees(pids: list[int], grace: float = 3.0, marks: Iterable[str] = ()) -> None:
    """Stop processes, all their descendants (those that left its session included) and every
    process carrying one of `marks`, at once; then SIGKILL what was started while they shut
    down, again by parent links and by mark, until no marked process is left (at most 2 s)."""
    marks = list(marks)
    family = [q for p in pids for q in (p, *descendants(p))] + marked(marks)
    terminate(family, grace)
    deadline = time.monotonic() + 2.0
    while True:
        late = [q for p in family for q in descendants(p)] + marked(marks)
        terminate(late, grace=0.0)
        if not late or time.monotonic() > deadline:
            return
        family = late
        time.sleep(0.05)


# ---- the watchdog --------------------------------------------------------------------------
_lock = threading.Lock()
_watchdog: subprocess.Popen | None = None
_watched: dict[int, tuple[str, str]] = {}  # pid -> (start time, mark), re-sent on a restart


def _send(line: str) -> None:
    """One registration line to the watchdog, started (again) when needed. Callers hold
    _lock."""
    global _watchdog
    for _ in range(2):
        if _watchdog is None or _watchdog.poll() is not None:
            _watchdog = subprocess.Popen(
                [sys.executable, "-I", str(Path(__file__).resolve()), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, text=True)  # Ctrl-C on the terminal does not reach it
            line = "".join(f"+{p} {t} {m}\n" for p, (t, m) in _watched.items()) + line
        try:
            assert _watchdog.stdin is not None
            _watchdog.stdin.write(line)
            _watchdog.stdin.flush()
            return
        except (BrokenPipeError, OSError):
            _watchdog = None


def watch(pid: int, mark: str = "") -> None:
    """Tie a child's process tree (and every process carrying `mark`) to this process: if this
    process dies without stopping the child (SIGKILL included), the watchdog stops it within a
    fraction of a second."""
    start = start_time(pid)
    if start is None:  # already gone (or not Linux: nothing to watch with)
        return
    with _lock:
        _watched[pid] = (start, mark)
        _send(f"+{pid} {start} {mark}\n")


def start_watched(cmd: Sequence[str], env: Mapping[str, str] | None = None,
                  **popen: Any) -> subprocess.Popen:  # noqa: ANN401 - Popen's own keywords
    """Popen a child with a new mark in its environment, watched with that mark."""
    marked_environment, mark = marked_env(env)
    process = subprocess.Popen(list(cmd), env=marked_environment, **popen)
    watch(process.pid, mark)
    return process


def mark_of(pid: int) -> str:
    """The mark a watched child was started with ('' if none, or no longer watched)."""
    with _lock:
        return _watched.get(pid, ("", ""))[1]


def unwatch(pid: int) -> None:
    """The child was stopped by its owner: forget it."""
    with _lock:
        if _watched.pop(pid, None) is not None:
            _send(f"-{pid}\n")


def _serve(stream) -> None:  # noqa: ANN001 - a text stream (stdin)
    """The watchdog: read registrations until EOF (the launcher ended), then stop every
    registered child that is still the same process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    registered: dict[int, tuple[str, str]] = {}
    for line in stream:
        op, *rest = line.split() or [""]
        try:
            pid = int(op[1:])
        except ValueError:
            continue
        if op.startswith("+") and rest:
            registered[pid] = (rest[0], rest[1] if len(rest) > 1 else "")
        elif op.startswith("-"):
            registered.pop(pid, None)
    stop_trees([pid for pid, (start, _) in registered.items() if start_time(pid) == start],
               marks=[mark for _, mark in registered.values()])


if __name__ == "__main__":
    _serve(sys.stdin)
