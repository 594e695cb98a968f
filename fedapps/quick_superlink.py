"""`flower-superlink` whose Fleet API holds an empty pull until a message arrives: opt-in.

Flower's SuperNode pulls the SuperLink for its next message and, when there is none, sleeps
(3 s; a quick SuperNode 0.05-3 s, fedapps/quick_supernode.py) before it pulls again, so every
step of a round starts on each node up to one sleep late and the server waits for the latest.
This entry runs Flower's own SuperLink with its Fleet pulls held (fedapps/held_pulls.py): a
pull that finds no message for the node waits up to `--link-hold` seconds and is answered as
soon as the ServerApp stores one, and a pull of an object the ServerApp has announced but not
pushed yet waits (as long) for the push. A quick SuperNode notices a held answer and pulls again at
once; a stock `flower-supernode` keeps its 3 s sleep after each held answer, so gains less.

    python -m fedapps.quick_superlink --link-hold 5 <flower-superlink arguments>

It refuses to start on a Flower whose Fleet handlers or stores it does not recognise.
`fedapps deploy-local --link-hold S` starts it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from fedapps.errors import ConfigError
from fedapps.held_pulls import (
    HELD_SECONDS,
    OBJECT_STORES,
    Arrivals,
    HeldHandler,
    hold_handlers,
    object_pending,
    unknown,
)
from fedapps.quick_supernode import run_patched

# A hold must outlast what a quick SuperNode reads as "held" and stay well inside the pull's
# HTTP timeout (30 s in flwr 1.41-1.42).
LONGEST_HOLD_SECONDS = 20.0
FLEET_HANDLERS = "flwr.superlink.servicer.fleet.fleet_handlers"
HANDLERS = (
    HeldHandler("pull_messages", ("request", "state", "store"),
                (("flwr.server.superlink.linkstate.in_memory_linkstate", "InMemoryLinkState"),
                 ("flwr.server.superlink.linkstate.sql_linkstate", "SqlLinkState")),
                "store_message_ins", lambda response: not response.messages_list),
    HeldHandler("pull_object", ("request", "state"), OBJECT_STORES, "put", object_pending),
)


def check_hold(seconds: float) -> None:
    if not 2 * HELD_SECONDS <= seconds <= LONGEST_HOLD_SECONDS:
        raise ConfigError(f"--link-hold {seconds:g}: must be from {2 * HELD_SECONDS:g} to "
                          f"{LONGEST_HOLD_SECONDS:g} s")


def check_flower(handlers: ModuleType) -> None:
    """Refuse a Flower whose Fleet pull handlers or stores are not the ones this patches."""
    import flwr

    differs = unknown(handlers, HANDLERS)
    if differs is not None:
        raise ConfigError(f"--link-hold: flwr {flwr.__version__}'s Fleet API is not the one "
                          f"this option holds (flwr 1.41-1.42: {differs}); run without "
                          f"--link-hold")


def check(seconds: float) -> None:
    """What `install` would refuse, as a ConfigError, before any process starts."""
    check_hold(seconds)
    check_flower(importlib.import_module(FLEET_HANDLERS))


def install(seconds: float) -> dict[str, Arrivals]:
    """Hold empty Fleet pulls in this process: a pull for a message until the link state
    stores one, a pull for an object announced but not pushed yet until the object store
    stores one."""
    check_hold(seconds)
    handlers = importlib.import_module(FLEET_HANDLERS)
    check_flower(handlers)
    return hold_handlers(handlers, HANDLERS, seconds)


def command(seconds: float, superlink_args: list[str]) -> list[str]:
    """The command line of a holding SuperLink with these `flower-superlink` arguments."""
    return [sys.executable, "-m", "fedapps.quick_superlink", "--link-hold", f"{seconds:g}",
            *superlink_args]


def main(argv: list[str] | None = None) -> None:
    run_patched(argv, "python -m fedapps.quick_superlink", "--link-hold",
                lambda seconds: install(seconds), "flwr.superlink.cli:flower_superlink")


if __name__ == "__main__":
    main()
