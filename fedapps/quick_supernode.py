"""`flower-supernode` with a shorter idle pull: opt-in (`--pull-interval`), for LAN clusters.

Flower's SuperNode loop (flwr 1.41-1.42, `flwr.supernode.start_client_internal`) sleeps 3 s
whenever a pull finds no message for it, and checks every 0.5 s whether its ClientApp has
replied; neither has an option. Between a round's fit and evaluate steps every node's pull comes
back empty, so each step starts on a node up to 3 s late, and the server waits for the latest
of the round's nodes. Measured at 20 SuperNodes on one 2-core machine (docs/PERFORMANCE.md,
"Shorter waits between steps"): a 0.5 s pull took 1.3 s off the evaluation step and nothing off
the fit step (round 3.04x -> 2.66x the simulated one); 0.2 s was slower than 0.5 s, its pulls
costing more CPU than they saved.

This entry runs Flower's own SuperNode with those two sleeps shortened (the 3 s one to
`--pull-interval`, the 0.5 s ones to a tenth of it, at most 0.05 s; after an empty pull that a
holding SuperLink held, fedapps/quick_superlink.py, the short one), and its retry of a
message's objects not yet at the SuperLink (1 s, doubling) started at 0.05 s and capped at
`--pull-interval`. Its Runtime API holds the warm ClientApp's pulls (fedapps/held_pulls.py): an
AcquireTask that finds no task waits for the loop to create one, and a pull of an object the
node has not received yet waits for it, so the ClientApp takes each message as soon as it is
there (on a Runtime API it does not know, Flower's is left as it is). Nothing else changed.
The cost is more pulls: one per node every `--pull-interval` seconds while idle, which the
SuperLink answers (its CPU is in the benchmark's table). It replaces the module's `time` name
with a wrapper, so it refuses to run on a Flower whose loop it does not recognise rather than
change something else:

    python -m fedapps.quick_supernode --pull-interval 0.5 <flower-supernode arguments>

`fedapps node --pull-interval S` and `fedapps deploy-local --pull-interval S` start it.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
import time
from collections.abc import Callable
from logging import INFO
from types import ModuleType
from typing import Any

from fedapps.errors import ConfigError
from fedapps.held_pulls import (
    HELD_SECONDS,
    OBJECT_STORES,
    HeldHandler,
    hold_handlers,
    object_pending,
    unknown,
)
from fedapps.object_retries import has_retry_keywords, shorten

FLOWER_IDLE_PULL_SECONDS = 3.0  # time.sleep(3) after an empty pull
FLOWER_REPLY_CHECK_SECONDS = 0.5  # time.sleep(0.5) while the ClientApp's reply is not ready
SHORTEST_PULL_SECONDS = 0.05  # below this a node pulls the SuperLink 20+ times a second, idle
# The sleeps of the loop as Flower 1.41-1.42 writes them, in order; anything else is refused.
KNOWN_SLEEPS = ["3", "0.5", "0.5"]
# Its Runtime API holds an empty task acquisition or object pull this long
# (fedapps/held_pulls.py); the warm ClientApp's HTTP timeout is 30 s.
TASK_HOLD_SECONDS = 5.0
RUNTIME_HANDLERS = "flwr.supernode.servicer.runtime.runtime_handlers"
RUNTIME_HELD = (
    HeldHandler("acquire_task", ("request", "state"),
                (("flwr.supernode.nodestate.in_memory_nodestate", "InMemoryNodeState"),),
                "create_task", lambda response: not response.token),
    HeldHandler("pull_object", ("request", "state", "task"), OBJECT_STORES, "put",
                object_pending),
)


class QuickSleeps:
    """Stands in for the `time` module inside Flower's SuperNode loop: the loop's two sleeps
    are shortened, every other attribute is the real module's. An empty pull that took at
    least HELD_SECONDS was held by a holding SuperLink (fedapps/quick_superlink.py), which
    answers as soon as a message arrives: then the node pulls again after the short sleep."""

    def __init__(self, pull_interval: float, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        check_interval(pull_interval)
        self.pull_interval = pull_interval
        self.reply_check = min(pull_interval / 10, 0.05)
        self._sleep, self._clock = sleep, clock
        self._woke: float | None = None  # when the last sleep ended: the pull began after it

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds == FLOWER_IDLE_PULL_SECONDS:
            held = self._woke is not None and self._clock() - self._woke >= HELD_SECONDS
            seconds = self.reply_check if held else self.pull_interval
        elif seconds == FLOWER_REPLY_CHECK_SECONDS:
            seconds = self.reply_check
        self._sleep(seconds)
        self._woke = self._clock()


def check_interval(pull_interval: float) -> None:
    if not SHORTEST_PULL_SECONDS <= pull_interval <= FLOWER_IDLE_PULL_SECONDS:
        raise ConfigError(f"--pull-interval {pull_interval:g}: must be from "
                          f"{SHORTEST_PULL_SECONDS:g} s to Flower's own "
                          f"{FLOWER_IDLE_PULL_SECONDS:g} s")


def flower_loop() -> ModuleType:
    return importlib.import_module("flwr.supernode.start_client_internal")


def check(pull_interval: float) -> None:
    """What `install` would refuse, as a ConfigError, before any process starts."""
    check_interval(pull_interval)
    check_loop(flower_loop())


def check_loop(module: ModuleType) -> None:
    """Refuse a SuperNode loop other than the one this entry was written against."""
    import flwr

    try:
        source = inspect.getsource(module)
    except OSError:  # an install without .py sources: nothing to check against
        source = ""
    sleeps = re.findall(r"\btime\.sleep\(([^)]*)\)", source)
    if sleeps != KNOWN_SLEEPS or getattr(module, "time", None) is not time \
            or not has_retry_keywords(getattr(module, "pull_objects", None)):
        raise ConfigError(
            f"--pull-interval: flwr {flwr.__version__}'s SuperNode loop is not the one this "
            f"option shortens (flwr 1.41-1.42: sleeps {KNOWN_SLEEPS} in {module.__name__}, "
            f"found {sleeps}); run without --pull-interval")


def install(pull_interval: float) -> QuickSleeps:
    """Shorten the sleeps of Flower's SuperNode loop in this process, and its wait for a
    message's objects the SuperLink does not hold yet (the ServerApp pushes a message before
    its objects): Flower looks again after 1 s, doubling to 10 s; a quick node after 0.05 s,
    doubling to its pull interval."""
    loop = flower_loop()
    check_loop(loop)
    quick = QuickSleeps(pull_interval)
    loop.time = quick
    shorten(loop, "pull_objects", cap=pull_interval, first=SHORTEST_PULL_SECONDS)
    if not hold_runtime_pulls():
        from flwr.supercore import log

        log(INFO, "[fedapps] the Runtime API's pulls left as they are (not flwr 1.41-1.42's):"
                  " the warm ClientApp polls its SuperNode")
    return quick


def hold_runtime_pulls(seconds: float = TASK_HOLD_SECONDS) -> bool:
    """Make this SuperNode's Runtime API hold an empty AcquireTask until the loop creates a
    task, and a pull of an object the node has not received yet until it has
    (fedapps/held_pulls.py): the warm ClientApp takes a task, and its model, at once instead
    of at its next poll or retry. True if it does so now; False, leaving Flower's as it is, on
    a Runtime API this does not know (the node then works as before)."""
    handlers = importlib.import_module(RUNTIME_HANDLERS)
    if unknown(handlers, RUNTIME_HELD) is not None:
        return False
    hold_handlers([(handlers, spec) for spec in RUNTIME_HELD], seconds)
    return True


def command(pull_interval: float, supernode_args: list[str]) -> list[str]:
    """The command line of a quick SuperNode with these `flower-supernode` arguments."""
    return [sys.executable, "-m", "fedapps.quick_supernode", "--pull-interval",
            f"{pull_interval:g}", *supernode_args]


def run_patched(argv: list[str] | None, prog: str, option: str,
                install_patch: Callable[[float], object], entry: str) -> None:
    """Take `option` (seconds) off the command line, patch Flower in this process with it, then
    run Flower's command `entry` ("module:function", e.g. flower_supernode) on the rest of the
    line; a bad value or an unknown Flower exits with a one-line error before Flower starts."""
    p = argparse.ArgumentParser(prog=prog, add_help=False,
                                allow_abbrev=False)  # Flower's own options pass through
    p.add_argument(option, dest="seconds", type=float, required=True)
    args, rest = p.parse_known_args(argv)
    try:
        install_patch(args.seconds)
    except ConfigError as err:
        sys.exit(f"fedapps: {err}")
    module, function = entry.split(":")
    sys.argv = [function.replace("_", "-"), *rest]
    getattr(importlib.import_module(module), function)()


def main(argv: list[str] | None = None) -> None:
    run_patched(argv, "python -m fedapps.quick_supernode", "--pull-interval",
                install, "flwr.supernode.cli:flower_supernode")


if __name__ == "__main__":
    main()
