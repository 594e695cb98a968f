"""A SuperNode serving its ClientApp tasks in a thread of its own process
(fedapps/one_process_node.py): the Runtime API's calls made on the node's own state, checked
on the installed Flower's node state and handlers; the deployment itself runs in
tests/test_deployment.py."""

import importlib
import sys
import time

import pytest
from flwr.proto.message_pb2 import PullObjectRequest
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.error import FlowerError
from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

import fedapps.one_process_node as one
from fedapps.deploy import SuperNode, supernode_command
from fedapps.errors import ConfigError


class Factory:
    """Flower's NodeStateFactory, reduced to the one state it returns."""

    def __init__(self):
        self.instance = InMemoryNodeState(InMemoryObjectStore())

    def state(self):
        return self.instance


@pytest.fixture
def node():
    """A node state with one ClientApp task, the handlers Flower's SuperNode app installs."""
    factory = Factory()
    factory.state().create_task(task_type=TaskType.CLIENT_APP, run_id=7, fab_hash="ab" * 32)
    handlers = importlib.import_module(one.SUPERNODE_APP)._RUNTIME_HANDLERS
    return factory, handlers


def acquire(factory, handlers):
    control = one.DirectRuntime(factory, handlers)
    return control.AcquireTask(
        AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value]))


def test_a_task_is_acquired_and_its_calls_are_that_tasks(node, monkeypatch):
    factory, handlers = node
    response = acquire(factory, handlers)
    assert response.HasField("task") and response.token
    client = one.DirectRuntime(factory, handlers, response.token)
    assert client.task().run_id == 7
    assert client.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success
    # a task call reaches the node's handler with the node's state and the token's task
    seen = []
    monkeypatch.setattr(handlers, "pull_object",
                        lambda request, state, task: seen.append((request, state, task)) or "r")
    request = PullObjectRequest(object_id="0" * 64)
    assert client.PullObject(request) == "r"
    assert seen == [(request, factory.state(), client.task())]


def test_the_real_handler_answers_an_object_the_node_does_not_hold(node):
    factory, handlers = node
    client = one.DirectRuntime(factory, handlers, acquire(factory, handlers).token)
    answer = client.PullObject(PullObjectRequest(object_id="0" * 64))
    assert not answer.object_found and not answer.object_available


def test_an_unknown_token_is_refused_as_over_http(node):
    factory, handlers = node
    for token in (None, "not-a-token"):
        with pytest.raises(FlowerError, match="authentication failed"):
            one.DirectRuntime(factory, handlers, token).PullTaskInput(PullTaskInputRequest())


def test_only_the_calls_a_clientapp_makes_exist(node):
    factory, handlers = node
    client = one.DirectRuntime(factory, handlers, "t")
    assert callable(client.PushObject) and callable(client.ConfirmMessageReceived)
    with pytest.raises(AttributeError, match="no Runtime API call 'GetNodes'"):
        client.GetNodes  # noqa: B018 - a ServerApp's call, not a ClientApp's


def test_a_heartbeat_for_a_task_the_node_forgot_warns_once_and_never_signals(node, caplog):
    """Flower's ClientApp SIGINTs its own process when its task is gone; here that process is
    the SuperNode, so the heartbeat only warns (and says True, so it is not retried)."""
    factory, handlers = node
    token = acquire(factory, handlers).token
    known = one.DirectRuntime(factory, handlers, token).task_heartbeat_fn()
    assert known()
    gone = one.DirectRuntime(factory, handlers, "forgotten").task_heartbeat_fn()
    with caplog.at_level("WARNING", logger="flwr"):
        assert gone() and gone()
    warnings = [r for r in caplog.records if "no longer knows this task" in r.getMessage()]
    assert len(warnings) == 1


def test_a_task_whose_token_the_node_dropped_ends_cleanly(node, caplog):
    """The node finished the task (its objects failed to arrive, say) before the ClientApp
    ran it: every call is refused with Flower's own error, which Flower's push of the task's
    output does not catch (it catches HTTP errors only). The task fails, nothing escapes, its
    heartbeat stops, and its line is logged."""
    import threading

    from flwr.common.constant import SubStatus

    import fedapps.warm_clientapp as warm

    factory, handlers = node
    response = acquire(factory, handlers)
    factory.state().finish_task(response.task.task_id, SubStatus.FAILED, "objects failed")
    threads = threading.active_count()

    class Apps:
        def get(self, run, fab):
            raise AssertionError("no input was pulled: the app is never asked for")

    def connect(token):
        return one.DirectRuntime(factory, handlers, token)

    with caplog.at_level("INFO", logger="flwr"):
        assert warm.run_task(connect, response.token, Apps()) is False
    assert threading.active_count() == threads  # the task's heartbeat thread has ended
    assert any("unknown task done in" in r.getMessage() for r in caplog.records)


def test_a_clientapp_thread_that_ends_ends_the_node(monkeypatch, caplog):
    """Left running without its ClientApp thread, the node would take messages no one runs:
    it is stopped instead (SIGTERM to itself, Flower's graceful exit)."""
    killed = []
    monkeypatch.setattr(one.os, "kill", lambda pid, sig: killed.append((pid, sig)))

    def serve(address, **kwargs):
        raise SystemExit("the app exited")

    with caplog.at_level("ERROR", logger="flwr"):
        one.serve_or_end_node(serve, 0.5, connect=None)
    assert killed == [(one.os.getpid(), one.signal.SIGTERM)]
    assert any("ClientApp thread ended (SystemExit: the app exited)" in r.getMessage()
               for r in caplog.records)


def test_the_app_flower_starts_also_starts_the_clientapp_thread(monkeypatch):
    import fedapps.warm_clientapp as warm

    served = []
    monkeypatch.setattr(warm, "serve", lambda address, **kw: served.append((address, kw)))
    monkeypatch.setattr(one.os, "kill", lambda pid, sig: None)  # the fake serve returns
    made = []

    class App:
        class state:  # noqa: N801 - FastAPI's app.state
            runtime_handlers = "handlers"

    def create_app(state_factory=None, superexec_auth_secret=None):
        made.append((state_factory, superexec_auth_secret))
        return App

    factory = Factory()
    create = one.serving_app(create_app, poll_max=0.5)
    assert create(state_factory=factory, superexec_auth_secret=b"s") is App
    for _ in range(100):  # the thread calls serve at once
        if served:
            break
        time.sleep(0.01)
    assert create(state_factory=factory, superexec_auth_secret=b"s") is App
    time.sleep(0.1)
    assert made == [(factory, b"s")] * 2 and len(served) == 1  # one thread, however called
    (address, kwargs), = served
    assert kwargs["poll_max"] == 0.5
    client = kwargs["connect"]("tok")
    assert isinstance(client, one.DirectRuntime)
    assert (client.state_factory, client.handlers, client.token) == (factory, "handlers", "tok")


def test_the_installed_flower_has_the_api_this_calls():
    one.check()


def test_another_supernode_app_or_handler_is_refused_in_one_line(monkeypatch):
    app = importlib.import_module(one.SUPERNODE_APP)
    monkeypatch.setattr(app, "create_app", lambda state_factory=None: None)
    with pytest.raises(ConfigError, match="--one-process: flwr .* not the one this option"):
        one.check()
    monkeypatch.undo()
    one.check()
    monkeypatch.setattr(app._RUNTIME_HANDLERS, "pull_object", lambda request, state: None)
    with pytest.raises(ConfigError, match="not the one this option calls"):
        one.check()


def test_a_node_that_would_start_clientapps_of_its_own_is_refused(monkeypatch):
    monkeypatch.setattr(one, "install", lambda seconds: pytest.fail("installed"))
    for isolation in ([], ["--isolation", "subprocess"], ["--isolation=subprocess"]):
        with pytest.raises(SystemExit, match="must run with --isolation process"):
            one.main(["--insecure", *isolation])


def test_main_installs_then_runs_flowers_supernode(monkeypatch):
    installed, passed = [], []
    monkeypatch.setattr(one, "install", installed.append)
    import flwr.supernode.cli as flower_cli

    monkeypatch.setattr(flower_cli, "flower_supernode", lambda: passed.append(list(sys.argv)))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    one.main(["--pull-interval", "0.5", "--insecure", "--isolation", "process"])
    assert installed == [0.5]
    assert passed == [["flower-supernode", "--insecure", "--isolation", "process"]]
    one.main(["--isolation=process"])
    assert installed == [0.5, None]


def test_commands_of_a_one_process_node(tmp_path):
    args = ["--insecure", "--isolation", "process"]
    assert supernode_command(args, None, one_process=True) == [
        sys.executable, "-m", "fedapps.one_process_node", *args]
    assert supernode_command(args, 0.5, one_process=True) == [
        sys.executable, "-m", "fedapps.one_process_node", "--pull-interval", "0.5", *args]
    with pytest.raises(ConfigError, match="only when warm"):
        SuperNode(link=None, index=0, config="", warm=False, one_process=True)


def test_the_cli_refuses_one_process_with_cold(capsys):
    from fedapps.cli import main

    code = main(["node", "--superlink", "127.0.0.1:9092", "--partition-id", "0",
                 "--num-partitions", "2", "--cold", "--one-process", "--check-only"])
    assert code == 2  # a config error, before anything starts
    assert "cannot go with --cold" in capsys.readouterr().err
