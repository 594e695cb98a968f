"""The warm ClientApp's polling of its SuperNode: quick after a task, about once a second idle.

A poll is an HTTP request the SuperNode answers; a fixed 0.05 s poll cost 20 warm nodes more CPU
than their training on a 2-core machine (docs/PERFORMANCE.md). Time is virtual here."""

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
    warm.serve("127.0.0.1:9094", poll_max=0.5)
    delays = [picked - ready for ready, picked in node.picked]
    assert len(delays) == 2 and max(delays) <= 0.5
    assert 20 / 0.5 <= node.polls <= 20 / 0.5 + 2 * 5  # idle at 0.5 s, not 1 s
