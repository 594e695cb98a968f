"""The warm ClientApp's polling of its SuperNode: quick after a task, about once a second idle.

A poll is an HTTP request the SuperNode answers; a fixed 0.05 s poll cost 20 warm nodes more CPU
than their training on a 2-core machine (docs/PERFORMANCE.md). Time is virtual here."""

import time
from types import SimpleNamespace

import pytest

import fedapps.warm_clientapp as warm


class _Clock:
    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds


class _Response:
    def __init__(self, token):
        self.token = token

    def HasField(self, name):  # noqa: N802 - protobuf's name
        return name == "task" and bool(self.token)


class _SuperNode:
    """Tasks become available at given times; the run ends at `end`."""

    def __init__(self, clock, task_times, end):
        self.clock, self.pending, self.end = clock, list(task_times), end
        self.polls, self.picked = 0, []

    def AcquireTask(self, request):  # noqa: N802 - Flower's name
        if self.clock.now >= self.end:
            raise KeyboardInterrupt
        self.polls += 1
        if self.pending and self.pending[0] <= self.clock.now:
            self.picked.append((self.pending.pop(0), self.clock.now))
            return _Response("token")
        return _Response("")

    def close(self):
        pass


def test_polls_back_off_while_idle_and_pick_tasks_up_within_a_second(monkeypatch):
    clock = _Clock()
    node = _SuperNode(clock, task_times=[0.0, 5.0, 5.65], end=20.0)
    ran = []
    monkeypatch.setattr(warm.time, "sleep", clock.sleep)
    monkeypatch.setattr(warm, "runtime_client", lambda *args, **kwargs: node)
    monkeypatch.setattr(warm, "run_task", lambda *args: ran.append(clock.now) or True)
    monkeypatch.setattr(warm, "prompt_object_pulls", lambda: None)  # Flower's module untouched
    warm.serve("127.0.0.1:9094")
    assert len(ran) == 3
    delays = [picked - ready for ready, picked in node.picked]
    assert max(delays) <= warm.POLL_MAX_SECONDS
    # 20 virtual seconds with 3 tasks: a fixed 0.05 s poll would ask about 400 times
    assert node.polls <= 3 + 20 / warm.POLL_MAX_SECONDS + 3 * 5
    # a task that follows soon after another is picked up quickly (the 5.65 s one, just
    # after the 5 s one): the fast polls restart after every task
    assert delays[2] <= 0.1


def test_a_quick_nodes_clientapp_waits_at_most_its_poll_max(monkeypatch):
    """Beside a quick SuperNode (--pull-interval 0.5) the idle wait stops at 0.5 s."""
    clock = _Clock()
    node = _SuperNode(clock, task_times=[0.0, 7.3], end=20.0)
    monkeypatch.setattr(warm.time, "sleep", clock.sleep)
    monkeypatch.setattr(warm, "runtime_client", lambda *args, **kwargs: node)
    monkeypatch.setattr(warm, "run_task", lambda *args: True)
    monkeypatch.setattr(warm, "prompt_object_pulls", lambda: None)
    warm.serve("127.0.0.1:9094", poll_max=0.5)
    delays = [picked - ready for ready, picked in node.picked]
    assert len(delays) == 2 and max(delays) <= 0.5
    assert 20 / 0.5 <= node.polls <= 20 / 0.5 + 2 * 5  # idle at 0.5 s, not 1 s


@pytest.mark.parametrize("fails", [False, True])
def test_a_task_hands_its_stamps_to_the_app_and_returns_the_context_without_them(monkeypatch,
                                                                                  fails, caplog):
    """The warm ClientApp stamps when it took the task and when its input was pulled into the
    node config the app's client_fn reads (fedapps/timing.py), and takes them out before the
    context goes back to the SuperNode, also when the app raises."""
    import time

    import flwr.supercore.heartbeat as heartbeat
    import flwr.supernode.runtime.run_clientapp as runtime
    from flwr.common import Context, RecordDict

    from fedapps.timing import INPUT_PULLED, NODE_STAMP_PREFIX, TASK_TAKEN, node_stamps

    context = Context(run_id=1, node_id=2, node_config={"partition-id": 0}, state=RecordDict(),
                      run_config={})
    seen, pushed = {}, {}

    class Beat:
        def __init__(self, fn):
            pass

        start = stop = lambda self: None

    def app(message, context):
        seen.update(node_stamps(context.node_config))
        if fails:
            raise RuntimeError("the client failed")
        return "r"

    class Apps:
        def get(self, run, fab):
            return app

    class Connection:
        def close(self):
            pass

    monkeypatch.setattr(heartbeat, "HeartbeatSender", Beat)
    monkeypatch.setattr(heartbeat, "make_task_heartbeat_fn_http", lambda client: None)
    message = SimpleNamespace(metadata=SimpleNamespace(message_type="train"))
    monkeypatch.setattr(runtime, "pull_task_input",
                        lambda client: (message, context, "run", "fab"))
    monkeypatch.setattr(runtime, "push_message", lambda c, reply, ctx: pushed.update(reply=reply))
    monkeypatch.setattr(runtime, "push_task_output",
                        lambda c, ctx, status, details: pushed.update(config=dict(ctx.node_config)))
    if fails:  # the error reply Flower's ClientApp sends, without a real message to answer
        import flwr.app

        monkeypatch.setattr(flwr.app, "Message", lambda content, reply_to: "error reply")
    taken = time.time() - 0.5
    with caplog.at_level("INFO", logger="flwr"):
        assert warm.run_task(lambda token: Connection(), "token", Apps(), taken) is not fails
    done = [r.getMessage() for r in caplog.records if "task done" in r.getMessage()]
    assert len(done) == 1 and done[0].startswith("[warm-clientapp] train task done in ")
    assert ("(FAILED)" if fails else "(COMPLETED)") in done[0].upper() and "resident" in done[0]
    assert seen[TASK_TAKEN] == taken and taken + 0.5 <= seen[INPUT_PULLED] <= time.time()
    assert pushed == {"reply": "error reply" if fails else "r", "config": {"partition-id": 0}}
    assert not any(k.startswith(NODE_STAMP_PREFIX) for k in context.node_config)


def test_a_task_whose_objects_are_late_is_pulled_within_a_fraction_of_a_second(monkeypatch):
    """Flower's SuperNode shows a task before it holds the message's objects; Flower's pull
    then waits 1 s per missing object (2 at a time). The warm ClientApp retries after 0.05 s:
    a message whose every object is missing on the first try arrives in well under 1 s."""
    import time

    import flwr.supernode.runtime.run_clientapp as runtime
    import numpy as np
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
    )
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(runtime, "pull_and_inflate_object_from_tree",
                        runtime.pull_and_inflate_object_from_tree)  # restored after the test
    for name in ("_run_id", "_node_id", "_task_id"):  # a message is built inside a task
        monkeypatch.setattr(TaskIdentity, name, 1)
    message = Message(RecordDict({"w": ArrayRecord([np.ones(3, dtype=np.float32)])}),
                      dst_node_id=1, message_type="train")
    contents = {k: v.deflate() for k, v in get_all_nested_objects(message).items()}
    assert len(contents) >= 3  # the message, its record dict, the record, the array
    tried = set()

    def pull(object_id):
        if object_id not in tried:  # not at the SuperNode yet
            tried.add(object_id)
            raise ObjectUnavailableError(object_id)
        return contents[object_id]

    warm.prompt_object_pulls()
    assert runtime.pull_and_inflate_object_from_tree.keywords["max_tries_per_object"] is None
    warm.prompt_object_pulls()  # a second call does not wrap the wrapper
    assert not hasattr(runtime.pull_and_inflate_object_from_tree.func, "keywords")
    start = time.perf_counter()
    got = runtime.pull_and_inflate_object_from_tree(get_object_tree(message), pull,
                                                    lambda object_id: None, return_type=Message)
    assert time.perf_counter() - start < 0.8  # Flower's own backoff: at least 0.8 s a retry
    assert got.content["w"].to_numpy_ndarrays()[0].tolist() == [1.0, 1.0, 1.0]
    assert tried == set(contents)


def test_each_task_logs_its_memory_in_the_line_the_benchmark_reads(monkeypatch):
    from simulations.deploy_benchmark import TASK_LINE

    steps = iter([(300, 310), (312, 315), (330, 372)])
    monkeypatch.setattr(warm, "memory_mb", lambda: next(steps))
    memory = [warm.memory_mb() for _ in range(3)]
    note = warm.memory_note(memory)
    assert note == "; resident 300 MB before, 312 with its input, 330 after; peak 310 -> 372 MB"
    line = f"INFO : [warm-clientapp] evaluate task done in 1.02 s (completed){note}"
    assert TASK_LINE.search(line).groups() == ("evaluate", "300", "312", "330", "310", "372")
    # input never pulled: no middle value; no /proc: no memory part
    assert warm.memory_note([(300, 310), (301, 310)]) == \
        "; resident 300 MB before, 301 after; peak 310 -> 310 MB"
    assert warm.memory_note([None, None]) == ""


def test_each_task_logs_its_cpu_in_the_line_the_benchmark_reads():
    from simulations.deploy_benchmark import TASK_CPU, TASK_LINE

    note = warm.cpu_note((1.0, 0.25, 1000, 7.0), (1.5, 0.375, 4731, 7.5))
    assert note == ("; CPU 0.62 s, kernel 0.12 s, 3731 page faults, 0.50 s in the task's"
                    " thread")
    line = ("INFO : [warm-clientapp] evaluate task done in 1.02 s (completed); resident 300 MB"
            f" before, 330 after; peak 310 -> 372 MB{note}")
    assert TASK_CPU.search(line).groups() == ("evaluate", "0.62", "0.12", "3731", "0.50")
    assert TASK_LINE.search(line).groups()[0] == "evaluate"  # the memory part still read
    assert warm.cpu_note(None, None) == ""


def test_cpu_usage_is_this_processes():
    import resource

    user, kernel, faults, thread = warm.cpu_usage()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert 0 < user <= usage.ru_utime and 0 <= kernel <= usage.ru_stime
    assert 0 < faults <= usage.ru_minflt
    assert 0 < thread <= time.thread_time()
    start = time.process_time()
    while time.process_time() - start < 0.05:  # some work: the next reading has grown
        pass
    assert warm.cpu_usage()[0] > user

    def spin() -> None:  # another thread's work counts for the process, not for this thread
        begun = time.thread_time()
        while time.thread_time() - begun < 0.2:
            pass

    import threading

    before = warm.cpu_usage()
    other = threading.Thread(target=spin)
    other.start()
    other.join()
    after = warm.cpu_usage()
    assert after[0] + after[1] - before[0] - before[1] >= 0.15
    assert after[3] - before[3] < 0.1


def test_memory_is_read_from_this_process():
    resident, peak = warm.memory_mb()
    import resource

    assert 0 < resident <= peak
    assert abs(peak - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024) <= 2


def test_status_fields_are_read_in_kb_and_a_missing_one_is_none():
    import resource

    from fedapps.processes import status_kb

    peak = status_kb("VmHWM")
    assert abs(peak - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) <= 2048
    assert status_kb("NoSuchField") is None and status_kb("VmRSS", pid=2**31) is None


def test_a_message_stored_just_after_its_task_is_waited_for(monkeypatch):
    """Flower's SuperNode creates a task, then stores its message: a ClientApp that takes the
    task in between is asked again shortly (a one-process node's thread did, 1 node in 20),
    and after MESSAGE_WAIT_SECONDS gets the empty answer Flower's pull fails on."""
    from flwr.proto.runtime_pb2 import PullAppMessagesResponse

    clock = _Clock()

    class Node:
        def __init__(self, stored_at):
            self.stored_at, self.asked = stored_at, []

        def PullMessages(self, request):  # noqa: N802 - Flower's name
            self.asked.append(clock.now)
            if clock.now < self.stored_at:
                return PullAppMessagesResponse()
            return PullAppMessagesResponse(messages_list=[{}])

        def PullObject(self, request):  # noqa: N802
            return "object"

    node = Node(stored_at=0.025)
    patient = warm.PatientMessagePull(node, sleep=clock.sleep, clock=lambda: clock.now)
    assert len(patient.PullMessages("req").messages_list) == 1
    assert node.asked == [0.0, 0.01, 0.03]  # 0.01 s, then doubling
    assert patient.PullObject("o") == "object"  # the other calls are the client's own
    never = Node(stored_at=float("inf"))
    clock.now = 0.0
    patient = warm.PatientMessagePull(never, sleep=clock.sleep, clock=lambda: clock.now)
    assert not patient.PullMessages("req").messages_list
    assert warm.MESSAGE_WAIT_SECONDS <= never.asked[-1] < warm.MESSAGE_WAIT_SECONDS + 1.0
    assert len(never.asked) < 15  # backing off to once a second, not 500 asks
