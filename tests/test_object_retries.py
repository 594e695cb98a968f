"""Flower's object pulls wrapped with a shorter retry schedule (fedapps/object_retries.py)."""

import functools
from types import SimpleNamespace

from fedapps.object_retries import shorten


def pull(ids, *, max_tries_per_object=500, initial_backoff=1.0, backoff_cap=10.0):
    return ids, max_tries_per_object, initial_backoff, backoff_cap


def test_a_known_pull_is_wrapped_once_and_a_second_call_replaces_the_schedule():
    module = SimpleNamespace(pull=pull)
    assert shorten(module, "pull", cap=0.5)
    assert module.pull("x") == ("x", None, 0.05, 0.5)  # no try cap: Flower's time limit holds
    assert shorten(module, "pull", cap=2.0, first=0.1)
    assert module.pull.func is pull and module.pull("y") == ("y", None, 0.1, 2.0)


def test_an_unknown_function_is_left_as_it_is():
    def other(ids, timeout=1.0):
        return ids

    module = SimpleNamespace(pull=other, partial=functools.partial(other, timeout=2.0))
    assert not shorten(module, "pull", cap=0.5) and module.pull is other
    assert not shorten(module, "partial", cap=0.5) and module.partial.keywords == {"timeout": 2.0}
    assert not shorten(module, "missing", cap=0.5) and not hasattr(module, "missing")
    assert not shorten(SimpleNamespace(pull=42), "pull", cap=0.5)
