"""Held pulls (fedapps/held_pulls.py): an empty pull waits in its server for the next thing
stored, and the quick SuperLink and SuperNode hold the Flower handlers they were written for."""

import contextlib
import importlib
import threading
import time
import types

import pytest
from flwr.proto.message_pb2 import PullObjectResponse

from fedapps import quick_superlink, quick_supernode
from fedapps.errors import ConfigError
from fedapps.held_pulls import (
    Arrivals,
    HeldHandler,
    hold_handlers,
    is_wrapped,
    object_pending,
    unknown,
)


class Box:
    """A store of one value and a pull of it that counts its calls (None: nothing there)."""

    def __init__(self):
        self.value, self.pulls = None, 0

    def pull(self):
        self.pulls += 1
        return self.value


def later(seconds, action):
    thread = threading.Timer(seconds, action)
    thread.start()
    return thread


def test_a_pull_that_finds_something_is_answered_at_once():
    box, arrivals = Box(), Arrivals()
    box.value = "message"
    t = time.monotonic()
    assert arrivals.hold(box.pull, lambda v: v is None, 5.0) == "message"
    assert box.pulls == 1 and time.monotonic() - t < 0.5


def test_an_empty_pull_is_answered_when_something_arrives():
    box, arrivals = Box(), Arrivals()

    def store():
        box.value = "message"
        arrivals.arrived()

    later(0.3, store)
    t = time.monotonic()
    assert arrivals.hold(box.pull, lambda v: v is None, 5.0) == "message"
    waited = time.monotonic() - t
    assert 0.25 < waited < 2.0, waited  # the arrival, not the 5 s hold nor a poll schedule
    assert box.pulls == 2  # once before the wait, once when woken


def test_an_arrival_for_another_pull_sends_it_back_to_waiting():
    box, arrivals = Box(), Arrivals()

    def store():
        box.value = "message"
        arrivals.arrived()

    later(0.2, arrivals.arrived)  # something for another node
    later(0.5, store)
    assert arrivals.hold(box.pull, lambda v: v is None, 5.0) == "message"
    assert box.pulls == 3


def test_nothing_arrives_the_pull_is_answered_empty_after_the_hold():
    box, arrivals = Box(), Arrivals()
    t = time.monotonic()
    assert arrivals.hold(box.pull, lambda v: v is None, 0.4) is None
    assert 0.35 < time.monotonic() - t < 2.0
    assert box.pulls == 2  # a look before the wait and one at its end


def test_an_arrival_between_the_look_and_the_wait_is_not_missed():
    """The thing is stored after the pull looked and before it waits: without the count read
    before the look the pull would sleep the whole hold."""
    box, arrivals = Box(), Arrivals()

    def pull_then_store():
        value = box.pull()
        if box.pulls == 1:
            box.value = "message"
            arrivals.arrived()
        return value

    t = time.monotonic()
    assert arrivals.hold(pull_then_store, lambda v: v is None, 5.0) == "message"
    assert box.pulls == 2
    assert time.monotonic() - t < 1.0


def test_beyond_the_slots_a_pull_is_answered_at_once():
    slots = threading.BoundedSemaphore(1)
    arrivals, held, other = Arrivals(slots), Box(), Box()
    first = threading.Thread(target=arrivals.hold, args=(held.pull, lambda v: v is None, 1.0))
    first.start()
    time.sleep(0.1)
    t = time.monotonic()
    assert arrivals.hold(other.pull, lambda v: v is None, 5.0) is None
    assert time.monotonic() - t < 0.5 and other.pulls == 1  # answered as Flower would
    first.join()
    assert slots.acquire(blocking=False)  # the slot came back


def test_closing_answers_held_pulls_and_holds_no_more():
    box, arrivals = Box(), Arrivals()
    later(0.2, arrivals.close)
    t = time.monotonic()
    assert arrivals.hold(box.pull, lambda v: v is None, 10.0) is None
    assert time.monotonic() - t < 2.0
    t = time.monotonic()
    assert arrivals.hold(box.pull, lambda v: v is None, 10.0) is None
    assert time.monotonic() - t < 0.5


def test_object_pending_is_an_object_announced_and_not_stored():
    assert object_pending(PullObjectResponse(object_found=True, object_available=False))
    assert not object_pending(PullObjectResponse(object_found=True, object_available=True,
                                                 object_content=b"x"))
    assert not object_pending(PullObjectResponse(object_found=False, object_available=False))


def fake_flower(tmp_path, monkeypatch, parameters="request, state"):
    """A handler module and a store class written to disk, as Flower's are."""
    (tmp_path / "fake_store.py").write_text(
        "class Store:\n    def __init__(self):\n        self.items = []\n"
        "    def put(self, item):\n        self.items.append(item)\n")
    (tmp_path / "fake_handlers.py").write_text(
        f"def pull({parameters}):\n    return state.items[0] if state.items else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("fake_store", "fake_handlers"):
        monkeypatch.delitem(importlib.sys.modules, name, raising=False)
    return importlib.import_module("fake_handlers"), importlib.import_module("fake_store")


def test_a_held_handler_is_woken_by_its_store(tmp_path, monkeypatch):
    handlers, store_module = fake_flower(tmp_path, monkeypatch)
    spec = HeldHandler("pull", ("request", "state"), (("fake_store", "Store"),), "put",
                       lambda v: v is None)
    assert unknown(handlers, (spec,)) is None
    held = hold_handlers([(handlers, spec)], 5.0)
    store = store_module.Store()
    later(0.3, lambda: store.put("message"))
    t = time.monotonic()
    assert handlers.pull("request", store) == "message"
    assert 0.25 < time.monotonic() - t < 2.0
    assert held["fake_handlers.pull"].count == 1 and is_wrapped(handlers.pull)
    assert is_wrapped(store_module.Store.put)
    # installed once: the wrapped handler and store are "unknown" to a second install
    assert "found" in unknown(handlers, (spec,))
    held["fake_handlers.pull"].close()


def test_a_handler_with_other_parameters_is_not_held(tmp_path, monkeypatch):
    handlers, _ = fake_flower(tmp_path, monkeypatch, parameters="request, state, task")
    spec = HeldHandler("pull", ("request", "state"), (("fake_store", "Store"),), "put",
                       lambda v: v is None)
    assert unknown(handlers, (spec,)) == \
        "fake_handlers.pull('request', 'state'), found ('request', 'state', 'task')"


@pytest.fixture
def flower_restored(monkeypatch):
    """Whatever the holds patch in Flower (handlers, store methods, the SuperLink's middleware
    list) is put back afterwards."""
    import flwr.superlink.main as superlink_main

    monkeypatch.setattr(superlink_main, "_get_middleware", superlink_main._get_middleware)
    for module_name, specs in ((quick_supernode.RUNTIME_HANDLERS, quick_supernode.RUNTIME_HELD),
                               (quick_superlink.FLEET_HANDLERS, quick_superlink.HANDLERS),
                               (quick_superlink.RUNTIME_HANDLERS, quick_superlink.REPLY_HANDLERS)):
        module = importlib.import_module(module_name)
        for spec in specs:
            monkeypatch.setattr(module, spec.name, getattr(module, spec.name))
            for cls in spec.store_classes():
                monkeypatch.setattr(cls, spec.store, getattr(cls, spec.store))


def test_a_quick_nodes_runtime_api_holds_a_task_acquisition(flower_restored):
    """On the installed Flower's own node state: the warm ClientApp's AcquireTask is answered
    when the SuperNode's loop creates the task, or empty after the hold."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    handlers = importlib.import_module(quick_supernode.RUNTIME_HANDLERS)
    assert quick_supernode.hold_runtime_pulls(1.0)
    assert not quick_supernode.hold_runtime_pulls(1.0)  # never wrapped twice
    state = InMemoryNodeState(InMemoryObjectStore())
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value])
    later(0.3, lambda: state.create_task(task_type=TaskType.CLIENT_APP, run_id=1,
                                         fab_hash="ab" * 32))
    t = time.monotonic()
    assert handlers.acquire_task(request, state).token
    assert 0.25 < time.monotonic() - t < 0.9
    t = time.monotonic()
    assert not handlers.acquire_task(request, state).token  # nothing more: empty after 1 s
    assert 0.9 < time.monotonic() - t < 2.0


def test_a_holding_superlink_wraps_its_fleet_pulls_once(flower_restored):
    handlers = importlib.import_module(quick_superlink.FLEET_HANDLERS)
    held = quick_superlink.install(5.0)
    assert sorted(held) == ["fleet_handlers.pull_messages", "fleet_handlers.pull_object",
                            "runtime_handlers.pull_messages", "runtime_handlers.pull_object"]
    # the object pulls of nodes and ServerApp wake on the same store's puts
    assert held["fleet_handlers.pull_object"] is held["runtime_handlers.pull_object"]
    assert held["fleet_handlers.pull_messages"] is not held["runtime_handlers.pull_messages"]
    replies = importlib.import_module(quick_superlink.RUNTIME_HANDLERS)
    for module in (handlers, replies):
        assert is_wrapped(module.pull_messages) and is_wrapped(module.pull_object)
    import flwr.superlink.main as superlink_main

    from fedapps.scoped_middleware import OnPaths  # and its middleware scoped

    assert sum(m.cls is OnPaths for m in superlink_main._get_middleware()) == 6
    with pytest.raises(ConfigError, match="run without --link-hold"):
        quick_superlink.check(5.0)


def test_a_holding_superlink_holds_the_serverapps_pull_for_its_replies(flower_restored):
    """On the installed Flower's Runtime API handler: a pull for the replies to given messages
    waits for a stored reply; Flower's own pull for no message in particular is answered at
    once (as before)."""
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest

    handlers = importlib.import_module(quick_superlink.RUNTIME_HANDLERS)
    quick_superlink.install(5.0)
    stored = []

    class State:  # the link state as the handler reads it; a reply is stored at 0.3 s
        object_store = None

        def get_message_res(self, message_ids, run_id):
            return list(stored)

        def get_message_ins(self, node_id, limit, run_id):
            return []

        def delete_messages(self, message_ins_ids):
            pass

    task = types.SimpleNamespace(run_id=1)
    t = time.monotonic()
    assert not handlers.pull_messages(PullAppMessagesRequest(message_ids=[]), State(), task
                                      ).messages_list
    assert time.monotonic() - t < 0.2
    reply = types.SimpleNamespace(metadata=types.SimpleNamespace(
        run_id=1, message_id="r", reply_to_message_id="m"))
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    def store_reply():  # Flower's own store method, wrapped: it wakes the held pull even when
        stored.append(reply)  # it fails, as here on a stand-in for the link state
        with contextlib.suppress(AttributeError):
            InMemoryLinkState.store_message_res(types.SimpleNamespace(), reply)

    later(0.3, store_reply)
    t = time.monotonic()
    with pytest.raises(AttributeError):  # the handler went on to read the (fake) reply
        handlers.pull_messages(PullAppMessagesRequest(message_ids=["m"]), State(), task)
    assert 0.25 < time.monotonic() - t < 2.0


def test_the_installed_flower_has_the_handlers_these_hold():
    """Fails when a Flower upgrade changes the Fleet or Runtime API handlers or stores: the
    holds must be rechecked against the new code before the pin moves."""
    quick_superlink.check(5.0)
    handlers = importlib.import_module(quick_supernode.RUNTIME_HANDLERS)
    assert unknown(handlers, quick_supernode.RUNTIME_HELD) is None


@pytest.mark.parametrize("seconds", [0, 1.5, 25, float("nan")])
def test_a_hold_outside_2_to_20_s_is_refused(seconds):
    with pytest.raises(ConfigError, match="--link-hold .*must be from 2 to 20 s"):
        quick_superlink.check(seconds)


def test_a_bad_hold_exits_before_flower_starts():
    with pytest.raises(SystemExit) as exit_:
        quick_superlink.main(["--link-hold", "1", "--insecure"])
    assert str(exit_.value) == "fedapps: --link-hold 1: must be from 2 to 20 s"


def test_a_quick_node_pulls_again_at_once_after_a_held_answer():
    """An empty pull that took over a second was held by the SuperLink, which answers as soon
    as a message arrives: the node's sleep after it is the short one, not the interval."""
    clock = types.SimpleNamespace(now=0.0)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        clock.now += seconds

    sleeps = quick_supernode.QuickSleeps(0.5, sleep=sleep, clock=lambda: clock.now)
    sleeps.sleep(3)  # the first empty pull: nothing known yet
    clock.now += 0.01  # a quick empty answer
    sleeps.sleep(3)
    clock.now += 5.0  # a held answer
    sleeps.sleep(3)
    assert slept == [0.5, 0.5, 0.05]
