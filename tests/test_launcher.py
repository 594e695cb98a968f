"""Process cleanup: descendants that left the process group (as Ray's do) are found and ended."""

import os
import subprocess
import sys
import time
from pathlib import Path

from fedapps.launcher import descendants, free_port, terminate, toml_string


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


def test_free_port_and_toml_strings():
    assert 1024 < free_port() < 65536
    assert toml_string('a "quoted" \\ path') == '"a \\"quoted\\" \\\\ path"'


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


class _FakeLink:
    """What `submit` needs of a LocalSuperLink; `flwr` is a script on the PATH it gives."""

    def __init__(self, tmp: Path, status: str) -> None:
        self.home, self.status, self.log_path = tmp, status, tmp / "superlink.log"
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        flwr = bin_dir / "flwr"  # prints what `flwr run --stream` printed for a crashed run
        flwr.write_text("#!/bin/sh\n"
                        "echo 'Successfully started run 42'\n"
                        "printf '\\033[92mINFO \\033[0m:  [fedapps] round 1/2  G 44.35%%\\n'\n"
                        "echo 'Traceback (most recent call last):'\n"
                        "echo \"NotADirectoryError: [Errno 20] Not a directory: 'x'\"\n"
                        "echo 'The above exception was the direct cause of the following'\n"
                        "echo 'RuntimeError: An error was encountered. Ending simulation.'\n"
                        "printf '\\033[91mERROR \\033[0m:  Exit Code: 700\\n'\n")
        flwr.chmod(0o755)
        self.path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": self.path}

    def run_status(self, run_id: str) -> str:
        return self.status


def test_a_crashed_run_is_marked_failed_and_redirected_logs_have_no_colour(tmp_path, capsys):
    import json

    from fedapps.launcher import submit

    out = tmp_path / "out" / "r"
    out.mkdir(parents=True)
    (out / "results.json").write_text(json.dumps({"rounds": [], "summary": {"status": "running"}}))
    run_config = {"experiment": "quickstart", "overrides": "", "output-dir": str(out.parent),
                  "run-name": "r"}
    link = _FakeLink(tmp_path, "finished:failed")
    assert submit(link, run_config, 2) == ("42", "finished:failed")
    shown = capsys.readouterr().out
    assert "[fedapps] round 1/2  G 44.35%" in shown and "Exit Code: 700" in shown
    assert "\x1b" not in shown  # captured stdout is not a terminal: no escape codes
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["status"] == (
        "failed: NotADirectoryError: [Errno 20] Not a directory: 'x' (run status "
        f"finished:failed; SuperLink log: {link.log_path})")


def test_a_status_the_run_wrote_itself_is_kept(tmp_path):
    import json

    from fedapps.results import mark_failed

    for status in ("completed", "stopped: round 2: 1 of 5 clients"):
        (tmp_path / "results.json").write_text(json.dumps({"summary": {"status": status}}))
        assert not mark_failed(tmp_path, "whatever")
        assert json.loads((tmp_path / "results.json").read_text())["summary"]["status"] == status
    assert not mark_failed(tmp_path / "missing", "no results.json: nothing to mark")
