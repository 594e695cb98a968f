"""One long-running ClientApp process per SuperNode (`flower-supernode --isolation process`).

Flower 1.41's default (`--isolation subprocess`) starts a fresh `flwr-clientapp` process for every
fit or evaluate message: on a 2-core CPU about 3 s of Python, PyTorch and data start-up each, and
the whole dataset pool in memory while it runs. With `--isolation process` the SuperNode starts
nothing and waits for an outside executor to take its tasks from the Runtime API; this module is
that executor. It does the work of Flower's own `flwr-clientapp` (pull the message, context and
FAB, call the ClientApp, push the reply and the context back: `flwr.supernode.runtime.
run_clientapp` is reused for every protocol step), but in one process that stays up, so imports,
the loaded app and the app's per-process data cache are paid for once per node.

What a message sees is what a simulated client sees in a Ray actor, which also runs many messages
in one process: state that must survive a message lives in the Context (pushed back after every
task) or on disk (`state-dir`), never in module globals; the data cache is keyed by the partition
settings. A run with another FAB (new app code) drops the previous FAB's modules first, so their
caches cannot leak into it. Messages run one after another: a message that never returns holds the
node's later ones back until the round times out (as the server then counts them anyway).

    python -m fedapps.warm_clientapp --runtime-api-address 127.0.0.1:9094 --parent-pid PID

`fedapps node` and `fedapps deploy-local` start it beside every SuperNode.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from fedapps.compute_slots import (  # stdlib only, like the other fedapps imports here
    ComputeSlots,
    from_environment,
    held_slot,
)
from fedapps.held_pulls import HELD_SECONDS

# Polls of the SuperNode for a task: fast right after start and after each task, then slower
# while idle, up to Flower's SuperExec's once a second. A poll is an HTTP request that this
# process and the SuperNode both handle in Python: with a fixed 0.05 s poll, 20 warm nodes'
# ClientApps and SuperNodes used 222 CPU seconds of a 153 s run on 2 cores, where the same
# experiment simulated used 43 in all (docs/PERFORMANCE.md, "On a quiet machine").
POLL_FIRST_SECONDS, POLL_MAX_SECONDS = 0.05, 1.0
# A task's objects the SuperNode does not hold yet: look again after 0.05 s, doubling to 1 s.
# Flower's SuperNode makes a task visible before it has pulled the message's objects from the
# SuperLink, and Flower's ClientApp then retries each missing object after 1 s, doubling to
# 10 s: with a quick SuperNode's shorter waits a warm ClientApp hit that on most messages
# (its pulls took 1.2 s a message, against 0.1 s beside Flower's slower pull; docs/
# PERFORMANCE.md, "The delivery split"; fedapps/object_retries.py).
OBJECT_RETRY_FIRST_SECONDS, OBJECT_RETRY_MAX_SECONDS = 0.05, 1.0
# A task's message the SuperNode does not hold yet: Flower's loop creates the task, then
# stores its message; a ClientApp that takes the task in between (a held AcquireTask wakes at
# the task's creation) finds no message. Ask again after 0.01 s, doubling to 1 s, for up to 5 s.
MESSAGE_RETRY_FIRST_SECONDS, MESSAGE_RETRY_MAX_SECONDS, MESSAGE_WAIT_SECONDS = 0.01, 1.0, 5.0
# The node-config keys of a task's stamps, as fedapps/timing.py reads them (a test checks they
# agree). Spelled out here: this process imports no fedapps module the app also imports, so a
# FAB whose code differs from this node's install brings its own (forget_modules_under).
STAMP_KEYS = ("fedapps-task-taken", "fedapps-input-pulled")


class WarmClientApps:
    """The ClientApps of the FABs this process has run, one FAB's modules loaded at a time."""

    def __init__(self) -> None:
        self.fab_hash: str | None = None
        self.app_dir: Path | None = None
        self.app = None

    def get(self, run, fab):  # noqa: ANN001, ANN201 - Flower's Run, Fab -> ClientApp
        from flwr.cli.install import install_from_fab
        from flwr.clientapp.utils import get_load_client_app_fn
        from flwr.common.config import get_project_dir

        if fab.hash_str != self.fab_hash:
            if self.app_dir is not None:
                forget_modules_under(self.app_dir)
            install_from_fab(fab.content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            self.app = load(run.fab_id, run.fab_version, fab.hash_str)
            self.fab_hash = fab.hash_str
            self.app_dir = Path(get_project_dir(run.fab_id, run.fab_version, fab.hash_str))
        return self.app


def forget_modules_under(folder: Path) -> None:
    """Drop the modules imported from an app folder, so a new FAB imports its own code."""
    root = str(folder.resolve())
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if path.startswith(root):
            del sys.modules[name]
    if root in sys.path:
        sys.path.remove(root)


def run_task(connect: Callable[[str | None], Any], token: str, apps: WarmClientApps,
             taken: float | None = None, slots: ComputeSlots | None = None) -> bool:
    """Run one ClientApp task in this process; True if the ClientApp completed it. `connect`:
    token -> a client of the SuperNode's Runtime API (over HTTP, or its handlers called
    directly in a one-process node, fedapps/one_process_node.py). `taken`: when the task was
    acquired (time.time()); with it the client's answer says how long the task took to arrive
    and to pull (fedapps/timing.py). `slots`: the ClientApp computes holding one of them
    (fedapps/compute_slots.py: deploy-local's nodes on one machine)."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore import log
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supernode.runtime.run_clientapp import (
        pull_task_input,
        push_message,
        push_task_output,
    )

    client = connect(token)
    # a one-process node's client brings its own heartbeat (Flower's HTTP one SIGINTs the
    # process when the task is gone, which there is the SuperNode)
    beat = getattr(client, "task_heartbeat_fn", None)
    heartbeat = HeartbeatSender(beat() if beat else make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message = reply = context = None
    status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
    started, used = time.perf_counter(), cpu_usage()
    memory = [memory_mb()]
    try:
        message, context, run, fab = pull_task_input(PatientMessagePull(client))
        memory.append(memory_mb())
        if taken is not None:
            stamp(context.node_config, taken, time.time())
        with held_slot(slots):  # deploy-local's nodes share the machine's cores
            reply = apps.get(run, fab)(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as ex:  # noqa: BLE001 - reported to the server, as flwr-clientapp does
        code, reason = ErrorCode.CLIENT_APP_RAISED_EXCEPTION, f"{type(ex)}:<'{ex}'>"
        if isinstance(ex, LoadClientAppError):
            code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
            reason = "An exception was raised when attempting to load `ClientApp`"
        log(ERROR, "ClientApp raised an exception", exc_info=ex)
        details = reason
        if message is not None:
            reply = Message(Error(code=code, reason=reason), reply_to=message)
    finally:
        if context is not None:
            unstamp(context.node_config)
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception as ex:  # noqa: BLE001
            log(ERROR, "Failed to push reply message", exc_info=ex)
            status = SubStatus.FAILED
        try:  # Flower's catches only HTTP errors; a one-process node's call raises its own
            push_task_output(client, context, status, details)
        except Exception as ex:  # noqa: BLE001 - e.g. the node no longer knows the task
            log(ERROR, "Failed to push task output", exc_info=ex)
            status = SubStatus.FAILED
        finally:
            heartbeat.stop()
            client.close()
    memory.append(memory_mb())
    kind = message.metadata.message_type if message is not None else "unknown"
    log(INFO, "[warm-clientapp] %s task done in %.2f s (%s)%s%s", kind,
        time.perf_counter() - started, status, memory_note(memory),
        cpu_note(used, cpu_usage()))
    return status == SubStatus.COMPLETED


class PatientMessagePull:
    """A Runtime API client whose PullMessages asks again while the task's message is not
    stored yet (MESSAGE_*); every other call is the client's own. Flower's `pull_task_input`
    fails the task on an empty answer: a one-process node's thread (fedapps/one_process_node.py)
    took a task before its message in 1 of 20 nodes of a benchmark run."""

    def __init__(self, client: Any, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.sleep, self.clock = client, sleep, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def PullMessages(self, request: Any) -> Any:  # noqa: N802 - Flower's client's name
        wait, end = MESSAGE_RETRY_FIRST_SECONDS, self.clock() + MESSAGE_WAIT_SECONDS
        while not (response := self.client.PullMessages(request)).messages_list \
                and self.clock() < end:
            self.sleep(wait)
            wait = min(2 * wait, MESSAGE_RETRY_MAX_SECONDS)
        return response


def memory_mb() -> tuple[int, int] | None:
    """(resident, peak resident) MB of this process from /proc (Linux: Jetson, Raspberry Pi);
    None elsewhere."""
    from fedapps.processes import status_kb  # stdlib only; no FAB's app imports it

    resident, peak = status_kb("VmRSS"), status_kb("VmHWM")
    return None if resident is None or peak is None else (resident // 1024, peak // 1024)


def memory_note(memory: list[tuple[int, int] | None]) -> str:
    """The task's line's memory part: resident MB before the task, once its input was pulled
    (if it was) and after it, and the process's peak before and after it
    (simulations/deploy_benchmark.py reads it)."""
    if any(m is None for m in memory):
        return ""
    before, *_, after = memory
    pulled = f", {memory[1][0]} with its input" if len(memory) == 3 else ""
    return (f"; resident {before[0]} MB before{pulled}, {after[0]} after;"
            f" peak {before[1]} -> {after[1]} MB")


def cpu_usage() -> tuple[float, float, int, float] | None:
    """(user CPU s, kernel CPU s, minor page faults) of this process so far and the CPU
    seconds of the calling thread; None without the resource module (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, usage.ru_minflt, time.thread_time()


def cpu_note(before: tuple[float, float, int, float] | None,
             after: tuple[float, float, int, float] | None) -> str:
    """The task's line's CPU part: the CPU seconds the process used while the task ran, of them
    in the kernel, its minor page faults (memory the kernel had to map in: a process that
    returns freed memory to the OS pays them again; fedapps/allocator.py), and the seconds of
    the task's own thread (the ClientApp's work: with --one-process the rest of the process's
    is the SuperNode's; torch here computes on that thread, one per client)."""
    if before is None or after is None:
        return ""
    user, kernel, faults, thread = (a - b for a, b in zip(after, before, strict=True))
    return (f"; CPU {user + kernel:.2f} s, kernel {kernel:.2f} s, {faults} page faults,"
            f" {thread:.2f} s in the task's thread")


def prompt_object_pulls() -> None:
    """Make Flower's ClientApp steps, in this process, retry a missing object of a task on
    OBJECT_RETRY_*'s schedule (Flower's own function, called with a shorter backoff)."""
    import flwr.supernode.runtime.run_clientapp as runtime
    from flwr.supercore import log

    from fedapps.object_retries import shorten

    if not shorten(runtime, "pull_and_inflate_object_from_tree", OBJECT_RETRY_MAX_SECONDS,
                   OBJECT_RETRY_FIRST_SECONDS):
        log(INFO, "[warm-clientapp] Flower's object pulls left as they are (not flwr 1.41-1.42's)")


def stamp(node_config: dict[str, Any], taken: float, pulled: float) -> None:
    """Hand the task's stamps to client_fn (fedapps/client_app.py) in the node config."""
    node_config.update(zip(STAMP_KEYS, (taken, pulled), strict=True))


def unstamp(node_config: dict[str, Any]) -> None:
    """Remove the stamps, so the context goes back to the SuperNode as it came."""
    for key in STAMP_KEYS:
        node_config.pop(key, None)


def runtime_client(address: str, insecure: bool, certificates: bytes | None,
                   token: str | None = None):  # noqa: ANN201 - flwr's RuntimeHttpClient
    """A client of the SuperNode's Runtime API (with the task's token once it has one)."""
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors = [RuntimeVersionHttpInterceptor(
        component_name="flwr-clientapp" if token else "SuperExec")]
    if token:
        interceptors.append(RuntimeTokenHttpInterceptor(token))
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker())


def serve(address: str, insecure: bool = True, root_certificates: str | None = None,
          parent_pid: int | None = None, poll_max: float = POLL_MAX_SECONDS,
          connect: Callable[[str | None], Any] | None = None) -> None:
    """Take this SuperNode's ClientApp tasks and run them here, until the SuperNode exits;
    `poll_max`: the longest wait between polls while idle. `connect`: token (None for the
    polls) -> a Runtime API client; by default an HTTP client of `address`. With
    FEDAPPS_COMPUTE_SLOTS and FEDAPPS_COMPUTE_SLOT_DIR set (deploy-local), each task computes
    holding one of those slots (fedapps/compute_slots.py)."""
    import torch  # noqa: F401 - the expensive imports, once and before the first message
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore import log
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.tls import validate_and_resolve_root_certificates

    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)  # SIGINT here when the SuperNode is gone
    if connect is None:
        certificates = validate_and_resolve_root_certificates(root_certificates, insecure)

        def connect(token: str | None) -> Any:
            return runtime_client(address, insecure, certificates, token)

    prompt_object_pulls()
    control = connect(None)
    apps = WarmClientApps()
    slots = from_environment()
    log(INFO, "[warm-clientapp] serving ClientApp tasks of %s%s", address,
        "" if slots is None else f", computing in one of {slots.count} slots at a time"
                                 f" ({slots.folder})")
    wait = POLL_FIRST_SECONDS
    try:
        while True:
            asked = time.monotonic()
            try:
                res = control.AcquireTask(
                    AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value]))
                if res.HasField("task") and res.token:
                    run_task(connect, res.token, apps, time.time(), slots)
                    wait = POLL_FIRST_SECONDS
                    continue
                if time.monotonic() - asked >= HELD_SECONDS:  # a quick SuperNode held it
                    wait = POLL_FIRST_SECONDS  # and answers the next at once: ask again soon
            except Exception as ex:  # noqa: BLE001 - one failed task must not end the node
                log(ERROR, "[warm-clientapp] %s: %s", type(ex).__name__, ex)
                wait = poll_max
            time.sleep(wait)
            wait = min(2 * wait, poll_max)
    except KeyboardInterrupt:
        pass
    finally:
        control.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fedapps.warm_clientapp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime-api-address", required=True,
                   help="the SuperNode's Runtime API (flower-supernode --port)")
    p.add_argument("--root-certificates", default=None,
                   help="CA of a TLS Runtime API (default: plain HTTP on loopback)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (the SuperNode) is gone")
    p.add_argument("--poll-max", type=float, default=POLL_MAX_SECONDS,
                   help=f"longest wait between polls while idle (default {POLL_MAX_SECONDS:g} s;"
                        " a quick SuperNode passes its --pull-interval)")
    args = p.parse_args(argv)
    if not args.poll_max >= POLL_FIRST_SECONDS:
        p.error(f"--poll-max {args.poll_max}: must be at least {POLL_FIRST_SECONDS} s")
    serve(args.runtime_api_address, insecure=args.root_certificates is None,
          root_certificates=args.root_certificates, parent_pid=args.parent_pid,
          poll_max=args.poll_max)


if __name__ == "__main__":
    main()
