"""Prompt replies: a deployed ServerApp sees each client's answer within 0.5 s (Flower's HttpGrid
looks every 3 s), with the same replies as Flower's own send_and_receive."""

from types import SimpleNamespace

import pytest
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.superlink.grid import HttpGrid, InMemoryGrid

from strategies.replies import PromptReplies, hasten


def reply(to):
    return SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=to))


class ScriptedGrid:
    """Pushed messages get ids m0, m1, ...; the k-th pull returns `script[k]`'s replies."""

    def __init__(self, script):
        self.script, self.pulls, self.pushed = list(script), 0, []

    def push_messages(self, messages):
        self.pushed.extend(messages)
        return [f"m{i}" for i in range(len(self.pushed))]

    def pull_messages(self, ids):
        got = self.script[self.pulls] if self.pulls < len(self.script) else []
        self.pulls += 1
        return [reply(i) for i in got if i in ids]


class Clock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def __call__(self):
        return self.now


def test_replies_are_looked_for_on_a_short_doubling_schedule():
    grid, clock = ScriptedGrid([[], [], [], [], [], ["m1"], [], ["m0"]]), Clock()
    prompt = PromptReplies(grid, sleep=clock.sleep, clock=clock)
    got = prompt.send_and_receive(["a", "b"])
    assert [m.metadata.reply_to_message_id for m in got] == ["m1", "m0"]
    assert clock.slept == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
    assert grid.pushed == ["a", "b"] and grid.pulls == 8
    # Flower's HttpGrid would have slept 3 s between these 8 pulls: 21 s against 2.25 s
    assert clock.now == pytest.approx(2.25)


def test_after_a_held_pull_the_next_pull_is_at_once():
    """A pull that took a second or more was held by a holding SuperLink, which answers as
    soon as a reply is stored: pull again without sleeping (a quick empty one: the schedule)."""
    grid, clock = ScriptedGrid([[], [], [], ["m0"]]), Clock()
    pull = grid.pull_messages

    def held_then_quick(ids):  # the 2nd and 3rd pulls held 5 s each
        clock.now += 5.0 if grid.pulls in (1, 2) else 0.01
        return pull(ids)

    grid.pull_messages = held_then_quick
    got = PromptReplies(grid, sleep=clock.sleep, clock=clock).send_and_receive(["a"])
    assert [m.metadata.reply_to_message_id for m in got] == ["m0"]
    assert clock.slept == [0.05] and grid.pulls == 4


def test_a_timeout_returns_the_replies_so_far():
    grid, clock = ScriptedGrid([["m0"]]), Clock()
    got = PromptReplies(grid, sleep=clock.sleep, clock=clock).send_and_receive(
        ["a", "b"], timeout=2.0)
    assert [m.metadata.reply_to_message_id for m in got] == ["m0"]
    assert 2.0 <= clock.now <= 2.5


@pytest.mark.parametrize("script", [[["m0", "m1"]], [[], ["m1"], [], [], ["m0"]],
                                    [[], [], ["m2"], ["m0", "m1", "m2"]]])
def test_same_replies_as_flowers_own_send_and_receive(script, monkeypatch):
    """Flower's HttpGrid.send_and_receive run on the same scripted grid (its 3 s sleeps
    skipped) returns the same replies in the same order."""
    import time

    import flwr.superlink.grid.http_grid as http_grid

    clock = Clock()
    ours = PromptReplies(ScriptedGrid(script), sleep=clock.sleep, clock=clock)
    monkeypatch.setattr(http_grid, "time", SimpleNamespace(time=time.time, sleep=lambda s: None))
    messages = ["a", "b", "c"][:len({i for pull in script for i in pull})]
    theirs = HttpGrid.send_and_receive(ScriptedGrid(script), messages, timeout=60)
    mine = ours.send_and_receive(messages, timeout=60)
    ids = [[m.metadata.reply_to_message_id for m in r] for r in (mine, theirs)]
    assert ids[0] == ids[1]


def test_only_deployed_proxies_are_hastened_once_even_when_wrapped():
    deployed = GridClientProxy(1, HttpGrid(token="t"), run_id=0)
    wrapped = SimpleNamespace(inner=SimpleNamespace(inner=deployed))
    hasten(wrapped)
    assert isinstance(deployed.grid, PromptReplies)
    first = deployed.grid
    hasten(deployed)
    assert deployed.grid is first  # not wrapped twice
    simulated = GridClientProxy(2, InMemoryGrid.__new__(InMemoryGrid), run_id=0)
    grid = simulated.grid
    hasten(simulated)
    assert simulated.grid is grid  # Flower's in-memory grid looks every 0.1 s already
    hasten(SimpleNamespace(cid="x"))  # a test's proxy without a grid: nothing to do
    hasten(object())  # nor one without attributes


def test_the_handshake_hastens_every_deployed_node():
    """strategies/nodes.py asks each new node for its properties: from then on its proxy's
    replies are looked for on the short schedule (one proxy object serves all later steps)."""
    from flwr.common import Code, GetPropertiesRes, Status

    from strategies.nodes import NodeDirectory

    class Answering(GridClientProxy):
        def get_properties(self, ins, timeout, group_id):
            return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": 0})

    proxy = Answering(5, HttpGrid(token="t"), run_id=0)
    NodeDirectory(num_clients=1, timeout=5)._ask([proxy], [5.0])
    assert isinstance(proxy.grid, PromptReplies)


def test_prompt_replies_forward_the_rest_of_the_grid():
    inner = SimpleNamespace(run="run", node="node", get_node_ids=lambda: [1, 2],
                            get_nodes=lambda: ["n1", "n2"],
                            set_run=lambda run: None,
                            create_message=lambda *a, **k: ("msg", a, k))
    prompt = PromptReplies(inner)
    assert prompt.run == "run" and prompt.node == "node" and list(prompt.get_node_ids()) == [1, 2]
    assert prompt.create_message(1, "train", 3, "") == ("msg", (1, "train", 3, ""), {})
    assert list(prompt.get_nodes()) == ["n1", "n2"]


def test_a_reply_whose_objects_are_late_is_pulled_within_a_fraction_of_a_second(monkeypatch):
    """The SuperLink hands out a reply before the node has pushed its objects; Flower's grid
    then waits 1 s per missing object. After hasten() the deployed grid looks again after
    0.05 s: a reply whose every object is missing on the first try arrives well under 1 s."""
    import time

    import flwr.superlink.grid.http_grid as http_grid
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.common.serde import message_to_proto
    from flwr.proto.message_pb2 import PullObjectResponse
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )
    from flwr.supercore.task_identity import TaskIdentity

    from strategies.replies import prompt_reply_objects

    for name in ("_run_id", "_node_id", "_task_id"):  # a message is built inside a task
        monkeypatch.setattr(TaskIdentity, name, 1)
    answer = Message(RecordDict({"w": ArrayRecord([np.full(3, 2.0, dtype=np.float32)])}),
                     dst_node_id=1, message_type="train")
    answer.metadata.__dict__["_message_id"] = answer.object_id
    contents = {k: v.deflate() for k, v in get_all_nested_objects(answer).items()}
    tried = set()

    class Link:  # the SuperLink's Runtime API, as the deployed grid calls it
        def PullMessages(self, request):  # noqa: N802 - Flower's names
            return PullAppMessagesResponse(messages_list=[message_to_proto(answer)],
                                           message_object_trees=[get_object_tree(answer)])

        def PullObject(self, request):  # noqa: N802
            first = request.object_id not in tried
            tried.add(request.object_id)
            return PullObjectResponse(object_found=True, object_available=not first,
                                      object_content=b"" if first else contents[request.object_id])

        def ConfirmMessageReceived(self, request):  # noqa: N802
            return None

    grid = HttpGrid(token="t")
    grid._client, grid._run = Link(), SimpleNamespace(run_id=1)

    def pull_seconds():
        tried.clear()
        start = time.perf_counter()
        got = list(grid.pull_messages([answer.object_id]))
        assert got[0].content["w"].to_numpy_ndarrays()[0].tolist() == [2.0, 2.0, 2.0]
        assert tried == set(contents)
        return time.perf_counter() - start

    assert pull_seconds() >= 0.8  # Flower's own schedule: 1 s for the first retry
    assert prompt_reply_objects()
    assert pull_seconds() < 0.8
    assert prompt_reply_objects()  # a second call keeps one wrapper around Flower's function
    assert not hasattr(http_grid.pull_objects.func, "keywords")


def test_hastening_a_deployed_proxy_shortens_the_grids_object_retries():
    import flwr.superlink.grid.http_grid as http_grid

    flower_pull = http_grid.pull_objects
    hasten(GridClientProxy(1, HttpGrid(token="t"), run_id=0))
    assert http_grid.pull_objects.func is flower_pull
    assert http_grid.pull_objects.keywords == {"initial_backoff": 0.05, "backoff_cap": 0.5,
                                               "max_tries_per_object": None}


def test_an_unknown_flower_pull_is_left_alone_and_said_once(monkeypatch, caplog):
    import flwr.superlink.grid.http_grid as http_grid

    import strategies.replies as replies

    def other(ids, timeout=1.0):
        return ids

    monkeypatch.setattr(http_grid, "pull_objects", other)
    monkeypatch.setattr(replies, "_UNKNOWN_PULL", [])
    with caplog.at_level("WARNING", logger="flwr"):
        hasten(GridClientProxy(1, HttpGrid(token="t"), run_id=0))
        hasten(GridClientProxy(2, HttpGrid(token="t"), run_id=0))
    assert http_grid.pull_objects is other
    assert sum("reply object pulls left as they are" in r.getMessage()
               for r in caplog.records) == 1


def test_the_pushes_of_one_grid_go_one_at_a_time():
    """Every proxy of a deployed ServerApp wraps the same grid: their pushes are ordered, so
    a step's later messages find the model's arrays at the SuperLink already."""
    import threading
    import time

    class SlowGrid:
        def __init__(self):
            self.now = self.most = 0
            self.lock = threading.Lock()

        def push_messages(self, messages):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            return list(messages)

    shared, other = SlowGrid(), SlowGrid()
    proxies = [PromptReplies(shared) for _ in range(5)] + [PromptReplies(other) for _ in range(2)]
    threads = [threading.Thread(target=p.push_messages, args=([i],))
               for i, p in enumerate(proxies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert shared.most == 1 and other.most == 1


def test_a_push_after_another_sends_only_its_own_objects(monkeypatch):
    """Why the pushes are ordered, on the installed Flower's object store: two messages with
    the same arrays, registered side by side, are both asked for every object; registered after
    the first one's objects are stored, the second is asked only for its own."""
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)
    model = ArrayRecord([np.arange(1000, dtype=np.float32), np.ones(7, dtype=np.float32)])

    def message(node):
        m = Message(RecordDict({"arrays": model}), dst_node_id=node, message_type="train")
        m.metadata.__dict__["_message_id"] = m.object_id
        return m

    def arrays(ids):
        return {i for i in ids if i in {a.object_id for a in model.values()}}

    first, second = message(1), message(2)
    side_by_side = InMemoryObjectStore()
    asked_first = side_by_side.preregister(1, get_object_tree(first))
    asked_second = side_by_side.preregister(1, get_object_tree(second))
    assert len(arrays(asked_first)) == len(arrays(asked_second)) == 2  # the model twice

    in_order = InMemoryObjectStore()
    for object_id in in_order.preregister(1, get_object_tree(first)):
        in_order.put(object_id, get_all_nested_objects(first)[object_id].deflate())
    asked_second = in_order.preregister(1, get_object_tree(second))
    assert asked_second and not arrays(asked_second)  # its own message object, no arrays
