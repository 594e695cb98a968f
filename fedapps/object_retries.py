"""Shorter retries of Flower's object pulls, for the three places a deployment meets them.

Flower 1.41-1.42 sends a message in two parts: the message itself, then its objects (the model's
arrays). The receiver can see the message before the objects are there, and Flower's pull then
retries each missing object after 1 s, doubling to 10 s. Where a message is taken as soon as it
shows, that second is paid on most messages (docs/PERFORMANCE.md, "The delivery split"): the
warm ClientApp (fedapps/warm_clientapp.py), a quick SuperNode (fedapps/quick_supernode.py) and
the ServerApp's reply pulls (strategies/replies.py) each wrap Flower's own pull function with a
shorter schedule here. No cap on the tries: Flower's time limit (2 h) still holds, where its 500
tries would end after 25 s at a 0.05 s schedule.

This module imports nothing of the project: the warm ClientApp process imports it, and a FAB's
own copy of the project must not find its modules already loaded from the node's install.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

FIRST_RETRY_SECONDS = 0.05
RETRY_KEYWORDS = frozenset({"initial_backoff", "backoff_cap", "max_tries_per_object"})


def has_retry_keywords(function: object) -> bool:
    """Whether `function` takes Flower 1.41-1.42's backoff keywords (so wrapping it is safe)."""
    try:
        return set(inspect.signature(function).parameters) >= RETRY_KEYWORDS
    except (TypeError, ValueError):
        return False


def shorten(module: ModuleType, name: str, cap: float, first: float = FIRST_RETRY_SECONDS
            ) -> bool:
    """Make `module.name`, a Flower pull function, retry a missing object after `first` s,
    doubling to `cap`. True if it does so now; False, leaving it as it is, if the function is
    not one this knows. A second call replaces the first's schedule (no wrapper of a wrapper)."""
    function = getattr(module, name, None)
    if isinstance(function, functools.partial):  # wrapped here before: wrap Flower's again
        function = function.func
    if not has_retry_keywords(function):
        return False
    setattr(module, name, functools.partial(function, initial_backoff=first, backoff_cap=cap,
                                            max_tries_per_object=None))
    return True
