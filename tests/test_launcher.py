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
