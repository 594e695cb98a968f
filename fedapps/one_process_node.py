"""A SuperNode and its warm ClientApp in one process: opt-in (`--one-process`).

A warm node (fedapps/warm_clientapp.py) is two processes: Flower's SuperNode, and the
long-running ClientApp beside it that takes each task from the SuperNode's Runtime API over
loopback HTTP, a request per step and per object of a message and its reply.
Here Flower's SuperNode starts as usual (`--isolation process`, so it starts no ClientApp
itself) and, once its Runtime API exists, a thread of the same process serves its tasks with
the warm ClientApp's own loop, calling that API's handlers directly on the node's state instead
of over HTTP. Measured on the 2-core machine with 20 nodes (docs/PERFORMANCE.md, "One process
per node"; means of four invocations): the round 1.33x the simulated one instead of 1.50x, 1.2
CPU seconds a round less in all (10.3 against 11.5), each node peaking 70-120 MB lower.

The price is isolation. The ClientApp's code runs in the SuperNode's interpreter: an exception
in a task is reported to the server as in a warm node, but a crash of the interpreter (a
segfault, the out-of-memory killer) ends the SuperNode too, and a task's Python shares the
node's GIL (torch releases it while it computes). A task whose node no longer knows it (its
heartbeat refused) runs to its end and its answer is refused, where Flower's ClientApp process
would interrupt itself. And the node's own modules (fedapps.errors, the patches of Flower) are
imported before the app loads, so the app uses this install's copies of those: keep a node's
install at the app's version, as deploy/README.md asks of every node.

    python -m fedapps.one_process_node [--pull-interval S] <flower-supernode arguments>

`fedapps node --one-process` and `fedapps deploy-local --one-process` start it; with
`--pull-interval` the SuperNode is also a quick one (fedapps/quick_supernode.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from logging import ERROR, WARNING
from typing import Any

from fedapps.errors import ConfigError
from fedapps.held_pulls import parameters

SUPERNODE_APP = "flwr.supernode.main"  # create_app(state_factory, superexec_auth_secret)
CORE_HANDLERS = "flwr.supercore.servicer.runtime.runtime_handlers"
# The Runtime API calls a warm ClientApp makes, as Flower's HTTP client names them, and the
# SuperNode handler each one is (flwr 1.41-1.42); a task's calls pass its token's task.
TASK_CALLS = {"PullTaskInput": "pull_task_input", "PullMessages": "pull_messages",
              "PullObject": "pull_object", "ConfirmMessageReceived": "confirm_message_received",
              "PushMessages": "push_messages", "PushObject": "push_object",
              "PushTaskOutput": "push_task_output"}


class DirectRuntime:
    """What a warm ClientApp asks of its SuperNode's Runtime API (the methods of Flower's
    `RuntimeHttpClient` it calls), answered by the node's own handlers on its own state: the
    same requests and responses, no HTTP. With a `token` its calls are that task's, and fail
    as over HTTP once the node no longer knows the token."""

    def __init__(self, state_factory: Any, handlers: Any, token: str | None = None) -> None:
        self.state_factory, self.handlers, self.token = state_factory, handlers, token

    def task(self) -> Any:
        """The task of this client's token, as the HTTP API's authentication finds it."""
        from flwr.supercore.error import ApiErrorCode, FlowerError

        state = self.state_factory.state()
        task = state.get_task_by_token(self.token) if self.token else None
        if task is None:
            raise FlowerError(ApiErrorCode.RUNTIME_AUTHENTICATION_FAILED,
                              "Runtime task-token authentication failed.")
        return task

    def AcquireTask(self, request: Any) -> Any:  # noqa: N802 - Flower's client's names
        return self.handlers.acquire_task(request, self.state_factory.state())

    def SendTaskHeartbeat(self, request: Any) -> Any:  # noqa: N802
        core = importlib.import_module(CORE_HANDLERS)
        return core.send_task_heartbeat(request, self.state_factory.state(), self.task())

    def __getattr__(self, name: str) -> Callable[[Any], Any]:
        if name not in TASK_CALLS:
            raise AttributeError(f"{type(self).__name__} has no Runtime API call {name!r}")
        handler = getattr(self.handlers, TASK_CALLS[name])
        return lambda request: handler(request, self.state_factory.state(), self.task())

    def task_heartbeat_fn(self) -> Callable[[], bool]:
        """The task's heartbeat (fedapps/warm_clientapp.py's run_task sends it): True while
        the node knows the task; once it does not, a warning and True, so the sender stops
        retrying, where Flower's ClientApp would SIGINT its own process (here the node)."""
        from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest
        from flwr.supercore import log

        warned = []

        def beat() -> bool:
            try:
                known = self.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success
            except Exception:  # noqa: BLE001 - the node refused the token: the task is gone
                known = False
            if not known and not warned:
                warned.append(True)
                log(WARNING, "[one-process node] the SuperNode no longer knows this task; it "
                             "runs to its end and its answer will be refused")
            return True

        return beat

    def close(self) -> None:
        """Nothing to close (the HTTP client's close)."""


def check() -> None:
    """Refuse a Flower whose SuperNode app or Runtime handlers this was not written against,
    as a ConfigError, before any process starts."""
    import flwr

    try:
        app = importlib.import_module(SUPERNODE_APP)
        core = importlib.import_module(CORE_HANDLERS)
        handlers = app._RUNTIME_HANDLERS  # noqa: SLF001 - the handlers create_app installs
        task_call = ["request", "state", "task"]
        known = (parameters(app.create_app) == ["state_factory", "superexec_auth_secret"]
                 and parameters(handlers.acquire_task) == ["request", "state"]
                 and all(parameters(getattr(handlers, name, None)) == task_call
                         for name in TASK_CALLS.values())
                 and parameters(core.send_task_heartbeat) == task_call)
    except (ImportError, AttributeError):
        known = False
    if not known:
        raise ConfigError(f"--one-process: flwr {flwr.__version__}'s SuperNode Runtime API is "
                          "not the one this option calls (flwr 1.41-1.42); run without it")


def serving_app(create_app: Callable[..., Any], poll_max: float) -> Callable[..., Any]:
    """Flower's `create_app`, which also starts this process's ClientApp thread on the state
    it is given (Flower calls it once, when it starts the Runtime API; a second call starts
    no second thread)."""
    from fedapps import warm_clientapp

    started = threading.Event()

    def create_and_serve(state_factory: Any = None,
                         superexec_auth_secret: bytes | None = None) -> Any:
        app = create_app(state_factory=state_factory,
                         superexec_auth_secret=superexec_auth_secret)
        if started.is_set():
            return app
        started.set()
        handlers = app.state.runtime_handlers

        def connect(token: str | None) -> DirectRuntime:
            return DirectRuntime(state_factory, handlers, token)

        threading.Thread(target=serve_or_end_node, args=(warm_clientapp.serve, poll_max,
                                                         connect),
                         name="fedapps-clientapp", daemon=True).start()
        return app

    return create_and_serve


def serve_or_end_node(serve: Callable[..., None], poll_max: float,
                      connect: Callable[[str | None], DirectRuntime]) -> None:
    """The ClientApp thread: serve the node's tasks; should that ever end (an import that
    fails, a SystemExit from the app), end the SuperNode as well (SIGTERM: Flower's graceful
    exit), rather than leave a node that takes messages no one runs."""
    from flwr.supercore import log

    try:
        serve("this process", poll_max=poll_max, connect=connect)
        reason = "it returned"
    except BaseException as ex:  # noqa: BLE001 - whatever it was, the node must not stay
        reason = f"{type(ex).__name__}: {ex}"
    log(ERROR, "[one-process node] the ClientApp thread ended (%s): stopping the SuperNode",
        reason)
    os.kill(os.getpid(), signal.SIGTERM)


def install(pull_interval: float | None) -> None:
    """Patch Flower's SuperNode in this process: its Runtime API holds empty task and object
    pulls (fedapps/held_pulls.py, so the thread takes a task the moment it exists), a quick
    SuperNode's loop with `pull_interval`, and the ClientApp thread started with the API."""
    from fedapps import quick_supernode
    from fedapps.warm_clientapp import POLL_MAX_SECONDS

    check()
    if pull_interval is not None:
        quick_supernode.install(pull_interval)  # also holds the Runtime API's pulls
    else:  # (on a Runtime API it does not know, the thread polls the state, still no HTTP)
        quick_supernode.hold_runtime_pulls()
    poll_max = POLL_MAX_SECONDS if pull_interval is None else min(pull_interval,
                                                                  POLL_MAX_SECONDS)
    app = importlib.import_module(SUPERNODE_APP)
    app.create_app = serving_app(app.create_app, poll_max)


def command(pull_interval: float | None, supernode_args: list[str]) -> list[str]:
    """The command line of a one-process node with these `flower-supernode` arguments."""
    quick = [] if pull_interval is None else ["--pull-interval", f"{pull_interval:g}"]
    return [sys.executable, "-m", "fedapps.one_process_node", *quick, *supernode_args]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fedapps.one_process_node", add_help=False,
                                allow_abbrev=False)  # Flower's own options pass through
    p.add_argument("--pull-interval", type=float, default=None)
    args, rest = p.parse_known_args(argv)
    isolation = [rest[i + 1] for i, a in enumerate(rest[:-1]) if a == "--isolation"]
    isolation += [a.split("=", 1)[1] for a in rest if a.startswith("--isolation=")]
    try:
        if isolation != ["process"]:
            raise ConfigError("--one-process: the SuperNode must run with --isolation process "
                              "(it must not start ClientApps of its own)")
        install(args.pull_interval)
    except ConfigError as err:
        sys.exit(f"fedapps: {err}")
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *rest]
    flower_supernode()


if __name__ == "__main__":
    main()
