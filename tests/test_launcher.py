"""Process cleanup: descendants that left the process group (as Ray's do) are found and ended."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fedapps.launcher import free_port, log_lines
from fedapps.processes import descendants, terminate


def test_descendants_include_children_in_their_own_session_and_terminate_ends_them():
    # parent -> child started with its own session (like Ray's raylet), both sleeping
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)'], start_new_session=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 20
        found = []
        while time.time() < deadline and not found:
            found = descendants(parent.pid)
            time.sleep(0.2)
        assert len(found) == 1
        child = found[0]
        assert os.getsid(child) != os.getsid(parent.pid)  # outside the parent's session
        terminate([child, parent.pid], grace=2)
        parent.wait(timeout=10)
        time.sleep(0.5)
        stat = Path(f"/proc/{child}/stat")  # gone, or a zombie awaiting its reaper
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_free_port():
    assert 1024 < free_port() < 65536


def test_node_settings_are_checked_with_one_line_errors(tmp_path):
    import pytest

    from fedapps.config import ConfigError
    from fedapps.deploy import check_node_settings

    closed = free_port()  # nothing listens there
    cases = [
        (("superlink-without-port", 0, 2, None, None), "expected host:port"),
        ((f"127.0.0.1:{closed}", 2, 2, None, None), "--partition-id=2: must be in 0..1"),
        ((f"127.0.0.1:{closed}", 0, 2, str(tmp_path), "fmnist"), "dataset fmnist not found"),
        ((f"127.0.0.1:{closed}", 0, 2, None, None), "cannot reach a SuperLink there"),
    ]
    for args, message in cases:
        with pytest.raises(ConfigError) as err:
            check_node_settings(*args)
        assert message in str(err.value) and "\n" not in str(err.value)


# ---- launcher death: everything it started dies with it -------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def processes_mentioning(text: str) -> list[int]:
    """Live (non-zombie) processes whose environment or command line contains `text`."""
    from fedapps.processes import running

    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            blob = (proc / "environ").read_bytes() + (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in blob and int(proc.name) != os.getpid() and running(int(proc.name)):
            found.append(int(proc.name))
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def kill_all(pids: list[int]) -> None:
    import contextlib
    import signal

    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_launcher(code: str) -> subprocess.Popen:
    """A Python process running `code` (a stand-in launcher) with this checkout importable;
    what it prints comes back through a pipe."""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_watched_children_die_with_a_sigkilled_launcher_even_if_started_from_a_thread():
    """The launcher registers a child from a worker thread that then ends (the case where
    PR_SET_PDEATHSIG would kill the child too early), and unregisters another one: after a
    SIGKILL of the launcher, the watched child and its grandchild in a session of its own are
    gone; the unwatched child was stopped by its owner's choice and is left alone."""
    from fedapps.processes import running

    marker = f"fedapps-watch-test-{os.getpid()}-{time.time_ns()}"
    sleeper = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
               f"'import time; time.sleep(60)', '{marker}'], start_new_session=True); "
               "time.sleep(60)")
    launcher = f"""
import subprocess, sys, threading, time
from fedapps.processes import unwatch, watch
def start():
    p = subprocess.Popen([sys.executable, '-c', {sleeper!r}, {marker!r}], start_new_session=True)
    watch(p.pid)
    print(p.pid, flush=True)
t = threading.Thread(target=start); t.start(); t.join()
q = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])
watch(q.pid); unwatch(q.pid)
print(q.pid, flush=True)
time.sleep(60)
"""
    proc = start_launcher(launcher)
    try:
        assert proc.stdout is not None
        watched, unwatched = int(proc.stdout.readline()), int(proc.stdout.readline())
        deadline = time.time() + 20
        while time.time() < deadline and len(processes_mentioning(marker)) < 4:
            time.sleep(0.1)
        grandchild = descendants(watched)
        assert len(grandchild) == 1 and running(watched) and running(unwatched)
        proc.kill()
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and (running(watched) or running(grandchild[0])):
            time.sleep(0.1)
        assert not running(watched) and not running(grandchild[0])
        assert running(unwatched)
    finally:
        proc.kill()
        kill_all(processes_mentioning(marker))


def test_a_process_orphaned_while_its_tree_stops_is_found_by_the_mark_it_inherited():
    """A watched child that, on SIGTERM, starts one more process in a session of its own and
    exits at once (as a raylet starting Ray's agents just as it is stopped): the new process is
    an orphan of init, no descendant of anything watched, when the watchdog sweeps again. The
    mark the child was started with, which the orphan inherits, finds it: it is stopped too."""
    from fedapps.processes import MARK_VAR, marked_env, running

    marker = f"fedapps-orphan-test-{os.getpid()}-{time.time_ns()}"
    child = f"""
import os, signal, subprocess, sys, time
def late(*_):
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}],
                     start_new_session=True)
    os._exit(0)
signal.signal(signal.SIGTERM, late)
print('ready', flush=True)
time.sleep(60)
"""
    launcher = f"""
import subprocess, sys, time
from fedapps.processes import start_watched
p = start_watched([sys.executable, '-c', {child!r}, {marker!r}], stdout=subprocess.PIPE, text=True)
p.stdout.readline()
print(p.pid, flush=True)
time.sleep(60)
"""
    proc = start_launcher(launcher)
    try:
        assert proc.stdout is not None
        watched = int(proc.stdout.readline())
        assert running(watched) and watched in processes_mentioning(marker)
        proc.kill()
        proc.wait()
        deadline = time.time() + 10
        while time.time() < deadline and (running(watched) or processes_mentioning(marker)):
            time.sleep(0.1)
        assert not running(watched) and processes_mentioning(marker) == []
    finally:
        proc.kill()
        kill_all(processes_mentioning(marker))
    # marks add up and stay the last variable (a process title overwrites the block's start)
    env, first = marked_env({"A": "1"})
    env, second = marked_env({**env, "B": "2"})
    assert list(env) == ["A", "B", MARK_VAR] and env[MARK_VAR] == f"{first} {second}"
    assert len(first) == 32 and first != second


def test_a_normal_stop_also_stops_what_was_orphaned_while_it_stopped():
    """The same orphan on a normal stop (LocalSuperLink.stop, SuperNode.stop): stop_trees with
    the child's mark ends it; by parent links alone it would be left running."""
    from fedapps.processes import mark_of, running, start_watched, stop_trees, unwatch

    marker = f"fedapps-stop-test-{os.getpid()}-{time.time_ns()}"
    child = ("import os, signal, subprocess, sys, time\n"
             "def late(*_):\n"
             f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', "
             f"{marker!r}], start_new_session=True)\n"
             "    os._exit(0)\n"
             "signal.signal(signal.SIGTERM, late)\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    proc = start_watched([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        stop_trees([proc.pid], grace=5.0, marks=[mark_of(proc.pid)])
        proc.wait(timeout=10)
        deadline = time.time() + 5
        while time.time() < deadline and processes_mentioning(marker):
            time.sleep(0.1)
        assert processes_mentioning(marker) == [] and not running(proc.pid)
    finally:
        unwatch(proc.pid)
        proc.kill()
        kill_all(processes_mentioning(marker))


def test_sigkill_of_fedapps_run_stops_the_superlink_its_executors_and_the_run(tmp_path):
    """`fedapps run` SIGKILLed once its simulation has started Ray: within seconds no process
    of the run is left (the SuperLink, its SuperExec, the ServerApp and simulation executors,
    Ray), found both as the launcher's descendants before the kill and by an environment
    variable they all inherit, so the run cannot go on; its results never say completed."""
    from fedapps.processes import running

    marker = f"FEDAPPS_TEST_RUN={tmp_path.name}-{time.time_ns()}"
    out = tmp_path / "out"
    results = out / "killed" / "results.json"
    cmd = [sys.executable, "-m", "simulations.cli", "run", "quickstart", "--set", "rounds=40",
           "--set", "output.plots=false", "--set", f"output.output-dir={out}",
           "--set", "output.run-name=killed"]
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1], "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "launcher.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        family: list[int] = []
        names: set[str] = set()
        # wait for Ray's raylet (about 15 s on an idle 2-core machine); on a crowded machine
        # settle after 120 s for the simulation executor that starts Ray
        deadline = time.time() + 120
        while proc.poll() is None and not (
                {"flower-superlin", "flwr-simulation", "raylet"} <= names
                or (time.time() > deadline and "flwr-simulation" in names)):
            assert time.time() < deadline + 120, names
            time.sleep(0.5)
            family = descendants(proc.pid)
            names = {comm(p) for p in family}
        assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-2000:]
        time.sleep(1)
        family = descendants(proc.pid)  # Ray's workers too, if they have started
        proc.kill()
        proc.wait()
        deadline = time.time() + 15
        while time.time() < deadline and (any(running(p) for p in family)
                                          or processes_mentioning(marker)):
            time.sleep(0.2)
        left = [p for p in family if running(p)] + processes_mentioning(marker)
        assert not left, sorted({comm(p) for p in left})
        time.sleep(1)
        if results.is_file():
            assert json.loads(results.read_text())["summary"]["status"] != "completed"
    finally:
        proc.kill()
        kill_all(processes_mentioning(marker))
        log.close()
class _FakeLink:
    """What `submit` needs of a LocalSuperLink: the log of a crashed run, in chunks that end
    inside lines as the Control API's may, and the status the SuperLink reports."""

    LOG = ("Successfully started run 42\n"
           "\033[92mINFO \033[0m:  [fedapps] round 1/2  G 44.35%\n"
           "Traceback (most recent call last):\n"
           "NotADirectoryError: [Errno 20] Not a directory: 'x'\n"
           "The above exception was the direct cause of the following\n"
           "RuntimeError: An error was encountered. Ending simulation.\n"
           "\033[91mERROR \033[0m:  Exit Code: 700\n")

    def __init__(self, tmp: Path, status: str) -> None:
        self.status, self.log_path, self.federation = status, tmp / "superlink.log", None

    def run_log(self, app_dir, run_config, federation):
        self.federation = federation
        chunks = [self.LOG[i:i + 17] for i in range(0, len(self.LOG), 17)]
        yield from log_lines(chunks)

    def run_status(self, run_id: str) -> str:
        return self.status


def test_streamed_chunks_become_whole_lines():
    assert list(log_lines(["a\nb", "c\n", "", "d\ne"])) == ["a\n", "bc\n", "d\n", "e\n"]
    assert list(log_lines(["x\n\n"])) == ["x\n", "\n"] and list(log_lines([])) == []


def test_a_crashed_run_is_marked_failed_and_redirected_logs_have_no_colour(tmp_path, capsys):
    import json

    from fedapps.launcher import submit

    out = tmp_path / "out" / "r"
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps({"rounds": [], "summary": {"status": "running"}}))
    run_config = {"experiment": "quickstart", "overrides": "", "output-dir": str(out.parent),
                  "run-name": "r"}
    link = _FakeLink(tmp_path, "finished:failed")
    assert submit(link, run_config, 2, total_cpus=1) == ("42", "finished:failed")
    assert link.federation == {"num_supernodes": 2, "client_resources_num_cpus": 1,
                               "client_resources_num_gpus": 0.0, "init_args_num_cpus": 1}
    shown = capsys.readouterr().out
    assert "[fedapps] round 1/2  G 44.35%" in shown and "Exit Code: 700" in shown
    assert "\x1b" not in shown  # captured stdout is not a terminal: no escape codes
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["status"] == (
        "failed: NotADirectoryError: [Errno 20] Not a directory: 'x' (run status "
        f"finished:failed; SuperLink log: {link.log_path})")


def test_a_refused_or_broken_off_submission_says_so_in_its_status(tmp_path):
    import httpx

    from fedapps.launcher import RunNotStarted, submit

    class Refusing(_FakeLink):
        def __init__(self, tmp: Path, error: Exception, lines: int) -> None:
            super().__init__(tmp, "finished:completed")
            self.error, self.lines = error, lines

        def run_log(self, app_dir, run_config, federation):
            yield from self.LOG.splitlines(keepends=True)[:self.lines]
            raise self.error

    refused = Refusing(tmp_path, RunNotStarted("ValueError: bad FAB"), 0)
    assert submit(refused, {}, 2) == (None, "not started (ValueError: bad FAB)")
    lost = Refusing(tmp_path, httpx.ReadError("connection reset"), 0)
    assert submit(lost, {}, 2) == (None, "not started (ReadError: connection reset)")
    # a stream that breaks off after the start: the SuperLink's status says how the run ended
    assert submit(Refusing(tmp_path, httpx.ReadError("reset"), 2), {}, 2) == \
        ("42", "finished:completed")


def test_an_app_that_cannot_be_bundled_is_not_started(tmp_path):
    import pytest

    from fedapps.launcher import LocalSuperLink, RunNotStarted

    link = LocalSuperLink(tmp_path)  # no process: the FAB fails before anything is sent
    with pytest.raises(RunNotStarted, match="pyproject.toml"):
        next(link.run_log(tmp_path, {}, None))


def test_a_status_the_run_wrote_itself_is_kept(tmp_path):
    import json

    from fedapps.results import mark_failed

    for status in ("completed", "stopped: round 2: 1 of 5 clients"):
        (tmp_path / "results.json").write_text(json.dumps({"summary": {"status": status}}))
        assert not mark_failed(tmp_path, "whatever")
        assert json.loads((tmp_path / "results.json").read_text())["summary"]["status"] == status
    assert not mark_failed(tmp_path / "missing", "no results.json: nothing to mark")


def test_run_status_falls_back_to_flwr_ls_when_the_control_api_call_fails(tmp_path):
    """No SuperLink listens on the link's port, so the direct Control API call fails; the
    status then comes from `flwr ls` (here a script printing what `flwr ls --format json`
    prints). That the direct call answers is checked in tests/test_deployment.py, where the
    fallback is made to fail."""
    from fedapps.launcher import LocalSuperLink

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flwr = bin_dir / "flwr"
    flwr.write_text("#!/bin/sh\necho '{\"success\": true, \"runs\": "
                    "[{\"run-id\": 7, \"status\": \"finished:stopped\"}]}'\n")
    flwr.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    link = LocalSuperLink(tmp_path, extra_env={"PATH": path})
    assert link.run_status("7") == "finished:stopped"
