"""Held pulls: an empty pull waits, in the process that serves it, for the next arrival.

Flower 1.41-1.42 delivers by polling: a SuperNode pulls the SuperLink for a message and, when
none is there, sleeps and pulls again; a ClientApp executor asks its SuperNode for a task the
same way; and a receiver pulls each object of a message (the model's arrays), which the sender
pushes after the message, retrying the ones not there yet with a growing backoff. A step thus
starts on a node up to one poll late and its model arrives up to one backoff late, and an idle
federation keeps serving pulls (20 quick SuperNodes idle on 2 cores: 0.43 of the cores,
docs/PERFORMANCE.md). Here a pull that finds nothing is held by its server for up to `seconds`
and answered as soon as something is stored (a long poll): the wait shrinks to the time the
store takes, and an idle node asks once per hold rather than once per poll interval.

`Arrivals` counts what is stored (a message for some node, a task, an object); every held pull
wakes on an arrival and pulls again in process (one wake per thing stored, cheap beside an HTTP
request), so a pull for something else goes back to waiting. A pull reads the count before it
looks, so an arrival between its look and its wait is never missed. At most MAX_HELD pulls are
held at a time in a server (each holds a thread of its pool); beyond that a pull is answered at
once, as by Flower. The entries that install this: fedapps/quick_superlink.py (the Fleet API's
pulls of messages and objects) and fedapps/quick_supernode.py (the Runtime API's task
acquisition and object pulls).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

R = TypeVar("R")

# A pull answered empty after at least this long was held by its server: the puller may ask
# again at once (fedapps/quick_supernode.py, fedapps/warm_clientapp.py). Holds are longer.
HELD_SECONDS = 1.0
# Pulls held at a time in one server: Flower's HTTP APIs run each request on a thread of one
# pool (anyio's, 40 threads), which its other requests (pushes, heartbeats) need too.
MAX_HELD = 24
# Where Flower keeps a message's objects, in every process (an object pull waits for a put).
OBJECT_STORES = (("flwr.supercore.object_store.in_memory_object_store", "InMemoryObjectStore"),
                 ("flwr.supercore.object_store.sql_object_store", "SqlObjectStore"))


class Arrivals:
    """What has been stored so far, for pulls that wait for the next thing stored."""

    def __init__(self, slots: threading.BoundedSemaphore | None = None) -> None:
        self._changed = threading.Condition()
        self._count = 0
        self._closed = False
        # one pull held per slot; share one set between the kinds of pull a server holds, as
        # they share its pool of threads
        self._slots = slots or threading.BoundedSemaphore(MAX_HELD)

    @property
    def count(self) -> int:
        with self._changed:
            return self._count

    def arrived(self) -> None:
        """Something was stored: wake every held pull."""
        with self._changed:
            self._count += 1
            self._changed.notify_all()

    def close(self) -> None:
        """The server is stopping: answer every held pull now, and hold no more (a request
        still held when the server stops ends in an error on both sides)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def hold(self, pull: Callable[[], R], is_empty: Callable[[R], bool], seconds: float) -> R:
        """`pull()` until it finds something or `seconds` have passed, waiting for an arrival
        between tries; at once, as one `pull()`, when every slot holds a pull already."""
        if not self._slots.acquire(blocking=False):
            return pull()
        try:
            deadline = time.monotonic() + seconds
            while True:
                seen = self.count
                result = pull()
                left = deadline - time.monotonic()
                if not is_empty(result) or left <= 0 or self._closed:
                    return result
                with self._changed:
                    self._changed.wait_for(lambda seen=seen: self._count != seen
                                           or self._closed, timeout=left)
        finally:
            self._slots.release()


def object_pending(response: Any) -> bool:
    """A PullObject answer for an object announced but not stored yet (Flower's
    `object_found` and not `object_available`): the one worth holding."""
    return bool(response.object_found and not response.object_available)


def parameters(function: object) -> list[str]:
    """The parameter names of `function`, [] where it has none to read."""
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def close_on_exit(arrivals: Arrivals) -> None:
    """Answer the held pulls when Flower's process begins its graceful exit (SIGTERM, SIGINT),
    before its API server stops."""
    from flwr.supercore.exit.exit_handler import add_exit_handler

    add_exit_handler(arrivals.close, run_before_force_exit=True)


def _any_request(request: Any) -> bool:
    """Every request may be held (HeldHandler's default)."""
    return True


@dataclass(frozen=True)
class HeldHandler:
    """A Flower pull handler to hold: `name` in its module, with these parameters (as flwr
    1.41-1.42 has them), woken by the `store` method of the classes `stores` (module, class);
    `holds(request)`: whether this request may be held (others are answered as by Flower)."""

    name: str
    parameters: tuple[str, ...]
    stores: tuple[tuple[str, str], ...]
    store: str
    is_empty: Callable[[Any], bool]
    holds: Callable[[Any], bool] = _any_request

    def store_classes(self) -> list[type]:
        return [getattr(importlib.import_module(m), c) for m, c in self.stores]


def unknown(module: ModuleType, handlers: tuple[HeldHandler, ...]) -> str | None:
    """What in `module` (or its stores) differs from the Flower `handlers` were written for,
    in a few words; None if nothing does."""
    for handler in handlers:
        function = getattr(module, handler.name, None)
        found = tuple(parameters(function))
        if found != handler.parameters or is_wrapped(function):
            return f"{module.__name__}.{handler.name}{handler.parameters}, found {found}"
        for cls in handler.store_classes():
            method = getattr(cls, handler.store, None)
            if not callable(method) or is_wrapped(method):
                return f"{cls.__name__}.{handler.store}"
    return None


def hold_handlers(held: Sequence[tuple[ModuleType, HeldHandler]], seconds: float
                  ) -> dict[str, Arrivals]:
    """Hold each (module, handler)'s empty answers in this process, woken by its store; the
    handlers of one store share its arrivals, all share MAX_HELD threads (one server's pool);
    held pulls are answered when the process exits. Keyed "<module's last name>.<handler>"."""
    slots = threading.BoundedSemaphore(MAX_HELD)
    by_store: dict[tuple[Any, ...], Arrivals] = {}
    result = {}
    for module, spec in held:
        key = (spec.stores, spec.store)
        if key not in by_store:
            arrivals = by_store[key] = Arrivals(slots)
            for cls in spec.store_classes():
                notify_after(cls, spec.store, arrivals)
            close_on_exit(arrivals)
        hold_function(module, spec, by_store[key], seconds)
        result[f"{module.__name__.rsplit('.', 1)[-1]}.{spec.name}"] = by_store[key]
    return result


def hold_function(module: ModuleType, spec: HeldHandler, arrivals: Arrivals,
                  seconds: float) -> None:
    """Replace `module.<spec.name>`, a pull handler, with one that holds an empty answer."""
    handler = getattr(module, spec.name)

    @functools.wraps(handler)
    def holding(*args: Any, **kwargs: Any) -> Any:
        if not spec.holds(kwargs["request"] if "request" in kwargs else args[0]):
            return handler(*args, **kwargs)
        return arrivals.hold(lambda: handler(*args, **kwargs), spec.is_empty, seconds)

    holding.__wrapped_by_fedapps__ = True  # type: ignore[attr-defined]
    setattr(module, spec.name, holding)


def notify_after(cls: type, name: str, arrivals: Arrivals) -> None:
    """Make `cls.name`, a method that stores something, wake the held pulls once it returns."""
    method = getattr(cls, name)

    @functools.wraps(method)
    def storing(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        finally:
            arrivals.arrived()

    storing.__wrapped_by_fedapps__ = True  # type: ignore[attr-defined]
    setattr(cls, name, storing)


def is_wrapped(function: object) -> bool:
    """Whether `function` was put there by this module (so it is not wrapped twice)."""
    return bool(getattr(function, "__wrapped_by_fedapps__", False))
