"""`flower-superlink` that holds an empty pull until what it asks for arrives: opt-in.

Flower's SuperNode pulls the SuperLink for its next message and, when there is none, sleeps
(3 s; a quick SuperNode 0.05-3 s, fedapps/quick_supernode.py) before it pulls again, so every
step of a round starts on each node up to one sleep late and the server waits for the latest;
and the ServerApp polls for each node's reply (every 0.05-0.5 s, strategies/replies.py). This
entry runs Flower's own SuperLink with those pulls held (fedapps/held_pulls.py): a node's pull
that finds no message waits up to `--link-hold` seconds and is answered as soon as the
ServerApp stores one; the ServerApp's pull for the replies to its messages is answered as soon
as a node's reply is stored; and a pull of an object announced but not pushed yet (a model on
its way in either direction) waits as long for the push. A quick SuperNode and a fedapps
ServerApp notice a held answer and pull again at once; a stock `flower-supernode` keeps its 3 s
sleep after each held answer, so gains less. It also sends each request through only the
HTTP middleware that acts on its API's paths (fedapps/scoped_middleware.py): on 20 nodes
sharing 2 cores that took the SuperLink's CPU a round from 4.7-4.9 to 2.7-3.3 s.

    python -m fedapps.quick_superlink --link-hold 5 <flower-superlink arguments>

It refuses to start on a Flower whose pull handlers or stores it does not recognise.
`fedapps deploy-local --link-hold S` starts it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

from fedapps import scoped_middleware
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
LINK_STATES = (("flwr.server.superlink.linkstate.in_memory_linkstate", "InMemoryLinkState"),
               ("flwr.server.superlink.linkstate.sql_linkstate", "SqlLinkState"))
HANDLERS = (
    HeldHandler("pull_messages", ("request", "state", "store"), LINK_STATES,
                "store_message_ins", lambda response: not response.messages_list),
    HeldHandler("pull_object", ("request", "state"), OBJECT_STORES, "put", object_pending),
)
# The ServerApp's side (its Runtime API, once ServerAppIo): a pull for the replies to given
# messages waits until a node's reply is stored, a pull of a reply's object not pushed yet
# until it is (Flower's own empty pulls, for no message in particular, are left alone).
RUNTIME_HANDLERS = "flwr.superlink.servicer.runtime.runtime_handlers"
REPLY_HANDLERS = (
    HeldHandler("pull_messages", ("request", "state", "task"), LINK_STATES,
                "store_message_res", lambda response: not response.messages_list,
                holds=lambda request: bool(request.message_ids)),
    HeldHandler("pull_object", ("request", "state", "task"), OBJECT_STORES, "put",
                object_pending),
)


def check_hold(seconds: float) -> None:
    if not 2 * HELD_SECONDS <= seconds <= LONGEST_HOLD_SECONDS:
        raise ConfigError(f"--link-hold {seconds:g}: must be from {2 * HELD_SECONDS:g} to "
                          f"{LONGEST_HOLD_SECONDS:g} s")


def held_modules() -> list[tuple[ModuleType, tuple[HeldHandler, ...]]]:
    """Flower's handler modules this holds, each with the handlers held in it."""
    return [(importlib.import_module(FLEET_HANDLERS), HANDLERS),
            (importlib.import_module(RUNTIME_HANDLERS), REPLY_HANDLERS)]


def check_flower() -> None:
    """Refuse a Flower whose Fleet or Runtime pull handlers or stores are not the ones this
    patches."""
    import flwr

    for module, handlers in held_modules():
        differs = unknown(module, handlers)
        if differs is not None:
            raise ConfigError(f"--link-hold: flwr {flwr.__version__}'s SuperLink is not the "
                              f"one this option holds (flwr 1.41-1.42: {differs}); run "
                              f"without --link-hold")


def check(seconds: float) -> None:
    """What `install` would refuse, as a ConfigError, before any process starts."""
    check_hold(seconds)
    check_flower()


def install(seconds: float) -> dict[str, Arrivals]:
    """Hold empty pulls in this process: a node's pull for a message until the link state
    stores one, the ServerApp's pull for replies until one is stored, and a pull of an object
    announced but not pushed yet until the object store stores one; and skip the Control-only
    and Fleet-only HTTP middleware on other paths (fedapps/scoped_middleware.py)."""
    check(seconds)
    scoped_middleware.install()
    return hold_handlers([(module, spec) for module, handlers in held_modules()
                          for spec in handlers], seconds)


def command(seconds: float, superlink_args: list[str]) -> list[str]:
    """The command line of a holding SuperLink with these `flower-superlink` arguments."""
    return [sys.executable, "-m", "fedapps.quick_superlink", "--link-hold", f"{seconds:g}",
            *superlink_args]


def main(argv: list[str] | None = None) -> None:
    run_patched(argv, "python -m fedapps.quick_superlink", "--link-hold",
                install, "flwr.superlink.cli:flower_superlink")


if __name__ == "__main__":
    main()
